"""
downloads.py: files over HTTP, verified and resumable: the Hub's parquet, tokenizer.json and model
files (prepare.py, pretrained.py), HellaSwag's jsonl from GitHub (evals.py). A failure is one
DataError line. say and Progress, the status lines and progress bars, serve prepare.py too.

    hub = Hub(Network())
    sha, listed = hub.files('HuggingFaceFW/fineweb-edu', 'main', 'sample/10BT', '.parquet')
    url = hub.url('datasets', 'HuggingFaceFW/fineweb-edu', sha, listed[0]['path'])
    download(hub, url, dest, listed[0])
"""

import contextlib
import dataclasses
import email.utils
import hashlib
import os
import re
import sys
import time

from ledgergpt.config import DataError
from ledgergpt.files import human_bytes, remove_quietly, write_text_atomic

# --------------------------------------------------------------------------------------------------
# Status lines go to stdout, flushed as they happen (a log written through a pipe shows them at
# once); errors go to stderr (config.cli). Progress is a tqdm bar on a terminal, and in a log, where
# a bar redrawn with carriage returns cannot be read, a plain line every PROGRESS_EVERY_S seconds.

PROGRESS_EVERY_S = 30.0


def say(line):
    """A status line on stdout, flushed; on a terminal above the progress bars, not through them."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


class Progress(contextlib.AbstractContextManager):
    """One job's progress: bytes and their rate (downloads), or tokens, ETA if total known."""

    def __init__(self, desc, total=None, unit=' tokens', initial=0, leave=True):
        from tqdm import tqdm

        self.meter = dict(prefix=desc, total=total, unit=unit, unit_scale=True, initial=initial)
        self.format_meter, self.n = tqdm.format_meter, initial
        self.started = self.reported = time.monotonic()
        self.waited = 0.0  # seconds spent waiting between tries (a Retry-After): not download time
        bar = dict(desc=desc, total=total, unit=unit, unit_scale=True, initial=initial, leave=leave)
        self.bar = tqdm(file=sys.stdout, dynamic_ncols=True, **bar) if sys.stdout.isatty() else None

    def update(self, n):
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif time.monotonic() - self.reported >= PROGRESS_EVERY_S:
            self.reported = time.monotonic()
            elapsed = self.reported - self.started - self.waited
            say(self.format_meter(self.n, elapsed=elapsed, ncols=0, **self.meter))

    def waited_for(self, seconds):
        """A wait between tries ended: not in the rate (a 60 s Retry-After is no slow download)."""
        self.waited += seconds
        if self.bar is not None:
            self.bar.unpause()  # tqdm's clock restarts from its last print: the wait is not counted

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


# --------------------------------------------------------------------------------------------------
# The Hub over plain HTTP: GET {endpoint}/api/{datasets|models}/{repo}/revision/{rev} -> {"sha"};
# GET .../tree/{sha}/{folder} -> [{"type": "file", "path", "size", "lfs": {"oid": sha256, "size"}}]
# (paged with a Link: <next>; rel="next" header); a file at {endpoint}/[datasets/]{repo}/resolve/
# {sha}/{path}, which redirects (302) to a CDN. HF_ENDPOINT (a mirror) and HF_TOKEN are honoured.
#
# The network is assumed hostile (docs/data.md, "FineWeb-Edu": the checks and the retries). A file
# grows in DEST.partial, renamed to DEST once it matches the listing (another total the server
# announces is an error, not a restart); a retry carries on with a Range made conditional with
# If-Range on the ETag, so a file that changed meanwhile comes whole, not glued to a stale prefix.

HUB_ENDPOINT = 'https://huggingface.co'
HTTP_ATTEMPTS = 10  # tries per request (a download's count starts again whenever bytes arrive)
MAX_BACKOFF_S = 30.0  # the doubling wait between tries stops growing here
HASH_ATTEMPTS = 3  # downloads of one file whose sha256 disagrees with the listing, before giving up
DOWNLOAD_CHUNK_BYTES = 1 << 20  # written to .partial chunk by chunk: a drop loses at most one


@dataclasses.dataclass
class Network:
    """How a Hub talks to its server. With the defaults a server that stalls on every try is given
    up after at most retry_budget_s + one read_timeout_s = 2 minutes, with a line at each retry."""

    endpoint: str = ''  # '' -> $HF_ENDPOINT, else https://huggingface.co
    connect_timeout_s: float = 10.0  # to open a connection
    read_timeout_s: float = 30.0  # of silence in the middle of an answer (a stalled server)
    retry_budget_s: float = 90.0  # how long a request may keep failing, waits included
    backoff_s: float = 1.0  # the first wait between tries; doubled after each, up to MAX_BACKOFF_S
    # what an error line advises checking (of a 404: not_found): the flags of the command that
    # chose the server and the files
    advice: str = '--endpoint or HF_ENDPOINT'
    not_found: str = '--sample, --revision and --endpoint'

    @property
    def base_url(self):
        return (self.endpoint or os.environ.get('HF_ENDPOINT') or HUB_ENDPOINT).rstrip('/')


class Retries:
    """One request's retry policy (above); a download calls progress() whenever bytes arrive."""

    def __init__(self, what, network):
        self.what, self.network, self.tries = what, network, 0
        # called with the seconds waited (a download's Progress.waited_for)
        self.after_wait = lambda seconds: None

    def progress(self):
        self.tries = 0

    def wait(self, problem, retry_after=None):
        """Sleep before the next try, or raise the DataError that gives up."""
        now, budget = time.monotonic(), self.network.retry_budget_s
        self.first_failure = self.first_failure if self.tries else now
        self.tries += 1
        failing_s = now - self.first_failure
        wait = min(MAX_BACKOFF_S, self.network.backoff_s * 2 ** (self.tries - 1))
        wait = wait if retry_after is None else retry_after
        if retry_after is not None and retry_after > budget:
            raise DataError(
                f"{self.what}: {problem}: the Hub asks to wait {retry_after:g} s, more than the "
                f"retry budget of {budget:g} s (--retry-budget): rerun later (what is done is kept)"
            )
        if self.tries >= HTTP_ATTEMPTS or failing_s + wait > budget:
            advice = f"check the network (and {self.network.advice}), then rerun"
            advice = "wait a while and rerun" if 'rate-limited' in problem else advice
            raise DataError(
                f"{self.what}: {problem}, still after {self.tries} tries in {failing_s:.0f} s: "
                f"{advice} (finished work is kept)"
            )
        say(
            f"{self.what}: {problem}: try {self.tries + 1} of at most {HTTP_ATTEMPTS} in "
            f"{wait:g} s (retry budget {budget:g} s)"
        )
        time.sleep(wait)
        self.after_wait(wait)


def retry_after_s(response):
    """Seconds a 429 or 503 answer asks to wait (Retry-After: seconds or an HTTP date), or None."""
    if (value := response.headers.get('Retry-After', '').strip()).isdigit():
        return float(value)
    with contextlib.suppress(TypeError, ValueError):
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    return None


NETWORK_PROBLEMS = {  # what urllib3 says, deep inside a requests exception -> what it means
    'Failed to resolve': "the host name does not resolve (DNS: offline?)",
    'Connection refused': "connection refused",
    'Network is unreachable': "the network is unreachable",
    'CERTIFICATE_VERIFY_FAILED': (
        "the server's TLS certificate is not trusted (a proxy intercepting HTTPS?)"
    ),
}


def network_problem(error, network):
    """A requests exception in words: which time-out, or why the connection failed."""
    import requests

    if isinstance(error, requests.ConnectTimeout):
        return f"no connection within {network.connect_timeout_s:g} s (connect time-out)"
    # mid-body it is a ConnectionError
    if isinstance(error, requests.ReadTimeout) or 'timed out' in str(error):
        return f"no data for {network.read_timeout_s:g} s (read time-out)"
    known = next((words for text, words in NETWORK_PROBLEMS.items() if text in str(error)), None)
    return known or f"connection lost ({type(error).__name__})"


# a 401 or 403, with a token in HF_TOKEN and without
REFUSED = {
    True: " with the token in HF_TOKEN: it has no access to this dataset (gated or private): "
    "accept the dataset's terms on its Hub page with the token's account, or check the token "
    "(read access)",
    False: ": the dataset is gated or private (or does not exist): accept its terms on its Hub "
    "page, then pass a read token from https://huggingface.co/settings/tokens as HF_TOKEN=hf_... "
    "python prepare.py ...",
}


class Hub:
    """GET requests to the Hub (or the mirror HF_ENDPOINT names) with retries; HF_TOKEN, if set,
    goes to that host only: requests drops the header on a redirect to another host (the CDN)."""

    def __init__(self, network=None):
        import requests

        self.network = network or Network()
        self.endpoint = self.network.base_url
        self.token = os.environ.get('HF_TOKEN', '')
        self.session = requests.Session()
        if self.token:
            self.session.headers['Authorization'] = f'Bearer {self.token}'

    def get(self, url, retries=None, headers=None, stream=False):
        """The response to a GET of `url` (status < 400), retrying time-outs, drops, 5xx and 429."""
        import requests

        retries = retries or Retries(url, self.network)
        timeout = (self.network.connect_timeout_s, self.network.read_timeout_s)
        while True:
            try:
                response = self.session.get(url, headers=headers, stream=stream, timeout=timeout)
            except (requests.ConnectionError, requests.Timeout) as e:
                retries.wait(network_problem(e, self.network))
                continue
            if (status := response.status_code) < 400:
                return response
            response.close()
            if status in (401, 403):
                raise DataError(f"{url}: HTTP {status}{REFUSED[bool(self.token)]}")
            if status == 404:
                raise DataError(f"{url}: not found (HTTP 404): check {self.network.not_found}")
            if status == 429:
                retries.wait("rate-limited by the Hub (HTTP 429)", retry_after_s(response))
            elif status >= 500 or status == 408:
                asked = retry_after_s(response) if status == 503 else None
                retries.wait(f"HTTP {status} {response.reason}", asked)
            else:
                raise DataError(f"{url}: HTTP {status} {response.reason}")

    def files(self, repo, revision, folder, extension, kind='datasets'):
        """(commit sha, sorted [{'path', 'size', 'sha256'}]) of the files ending in `extension` in a
        folder ('': the top) of a dataset or model repo at a revision. sha256 is a file in LFS's
        object id; a file kept in git has its blob id as 'git_sha1' instead."""
        sha = self.api_json(f"{self.endpoint}/api/{kind}/{repo}/revision/{revision}")[1]['sha']
        url = f"{self.endpoint}/api/{kind}/{repo}/tree/{sha}" + (f"/{folder}" if folder else '')
        listed = []
        while url:
            response, answer = self.api_json(url)
            for item in answer:
                if item['type'] == 'file' and item['path'].endswith(extension):
                    lfs = item.get('lfs') or {}
                    size, sha256 = lfs.get('size', item['size']), lfs.get('oid')
                    blob_id = {} if lfs else {'git_sha1': item.get('oid')}
                    listed.append({'path': item['path'], 'size': size, 'sha256': sha256, **blob_id})
            url = response.links.get('next', {}).get('url')
        if not listed:
            advice = ': check --sample' if kind == 'datasets' else ''
            raise DataError(f"no {extension} files in {repo}/{folder} at {revision}{advice}")
        return sha, sorted(listed, key=lambda item: item['path'])

    def url(self, kind, repo, sha, path):
        """Where the Hub serves a file of a dataset or model repo at a commit."""
        where = f"{'datasets/' if kind == 'datasets' else ''}{repo}"
        return f"{self.endpoint}/{where}/resolve/{sha}/{path}"

    def api_json(self, url):
        """(response, its JSON) of the Hub's API; a captive portal's page is one DataError."""
        response = self.get(url)
        try:
            return response, response.json()
        except ValueError:
            what = "not an answer of the Hub's API"
            raise not_the_file(url, what, response, response.content, self.network.advice) from None


class ListingMismatch(DataError):
    """Every download disagreed with the listing's hash (prepare.py lists them again, once)."""


def file_digest(path, listed):
    """(kind, actual, expected) of the check a listing entry allows: the sha256 of a file in LFS, or
    git's blob id of a file kept in git (sha1 of b'blob <size>\\0' + its bytes); (None, None, None)
    if neither, and then only the size is checked."""
    kind = 'sha256' if listed.get('sha256') else 'git sha1' if listed.get('git_sha1') else None
    if kind is None:
        return None, None, None
    size = os.path.getsize(path)
    new = hashlib.sha256 if kind == 'sha256' else lambda: hashlib.sha1(b'blob %d\0' % size)
    with open(path, 'rb') as f:
        actual = hashlib.file_digest(f, new).hexdigest()
    return kind, actual, listed['sha256' if kind == 'sha256' else 'git_sha1']


def download(hub, url, dest, listed, starts_with=b'PAR1'):
    """`url` to `dest` (its folder made) via `dest`.partial, resumed after drops, renamed once its
    size and hash match `listed` (its listing entry), up to HASH_ATTEMPTS tries; a file at `dest` is
    checked too. `starts_with`: a good file's first bytes (parquet's magic): other bodies named."""
    name, size = os.path.basename(dest), listed['size']
    if os.path.exists(dest):
        wrong = f'{os.path.getsize(dest):,} bytes, not {size:,}'
        if os.path.getsize(dest) == size:
            kind, actual, expected = file_digest(dest, listed)
            if actual == expected:
                return dest
            wrong = f'{kind} {actual}, not {expected}'
        say(f"{dest} does not match the listing ({wrong}): downloading it again")
        os.remove(dest)
    os.makedirs(os.path.dirname(dest) or '.', exist_ok=True)
    partial, etag_path = dest + '.partial', dest + '.etag'
    retries = Retries(listed['path'], hub.network)
    for attempt in range(1, HASH_ATTEMPTS + 1):
        started, initial = time.monotonic(), min(size, size_of(partial))
        with Progress(name, size, unit='B', initial=initial, leave=False) as progress:
            retries.after_wait = progress.waited_for
            while size_of(partial) != size:
                fetch_rest(hub, url, partial, etag_path, size, starts_with, retries, progress)
        kind, actual, expected = file_digest(partial, listed)
        remove_quietly(etag_path)
        if actual == expected:
            os.replace(partial, dest)
            verified = f', {kind} verified' if kind else ''
            say(f"{name}: {human_bytes(size)} in {time.monotonic() - started:.0f} s{verified}")
            return dest
        remove_quietly(partial)
        if attempt < HASH_ATTEMPTS:
            say(
                f"{name}: {kind} {actual} differs from the listing's {expected}: downloading it "
                f"again ({attempt + 1} of {HASH_ATTEMPTS})"
            )
            time.sleep(hub.network.backoff_s * 2**attempt)
    raise ListingMismatch(
        f"{name}: {kind} {actual} after {HASH_ATTEMPTS} downloads, but the listing says "
        f"{expected}: the data is damaged on the way (a proxy or mirror?): check "
        f"{hub.network.advice} and rerun"
    )


def size_of(path):
    return os.path.getsize(path) if os.path.exists(path) else 0


def fetch_rest(hub, url, partial, etag_path, size, starts_with, retries, progress):
    """One request for what `partial` lacks (its answer checked first), streamed onto its end until
    done or dropped (then the caller asks again)."""
    import requests

    dropped = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)
    have = size_of(partial)
    if have > size:  # longer than the file: damaged, start over
        os.remove(partial)
        have = 0
    headers = {'Range': f'bytes={have}-'} if have else {}
    if have and os.path.exists(etag_path):
        with open(etag_path) as f:
            headers['If-Range'] = f.read()
    with hub.get(url, retries, headers, stream=True) as response:
        start = check_answer(response, url, have, size, hub.network.advice)
        if have and not start:
            say(
                f"{url}: the server sent the whole file again (it changed, or ignores ranges): "
                "starting over"
            )
            progress.update(-have)
        if not start:  # a new body: keep its ETag for If-Range (a weak W/ one cannot be used there)
            etag = response.headers.get('ETag', '')
            remove_quietly(etag_path)
            if etag and not etag.startswith('W/'):
                write_text_atomic(etag_path, etag)
        try:
            with open(partial, 'ab' if start else 'wb') as f:
                for chunk in response.iter_content(chunk_size=DOWNLOAD_CHUNK_BYTES):
                    if f.tell() == 0 and not chunk.startswith(starts_with[: len(chunk)]):
                        what = "the server sent something else than the file"
                        raise not_the_file(url, what, response, chunk, hub.network.advice)
                    if f.tell() + len(chunk) > size:
                        raise size_mismatch(url, f"more than {size:,}", size, hub.network.advice)
                    f.write(chunk)
                    progress.update(len(chunk))
                    retries.progress()
                # an answer without a byte of what is missing: a failure like any other
                if f.tell() == start:
                    retries.wait("the server sent no data")
        except dropped as e:  # half way: the next request asks for the rest
            retries.wait(network_problem(e, hub.network))


def size_mismatch(url, sent, size, advice):
    return DataError(
        f"{url}: the server sends {sent} bytes but the Hub's listing says {size:,}: a proxy or "
        f"mirror in the way (check {advice}), or a stale files.json in the data "
        f"folder (delete it to list the files again)"
    )


def not_the_file(url, what, response, body, advice):
    """What came instead (a captive portal's login page) as a DataError: "text/html: '<html>..."."""
    start = ' '.join(body[:200].decode('utf-8', 'replace').split())[:80]
    kind = response.headers.get('Content-Type', 'no Content-Type')
    return DataError(
        f"{url}: {what} ({kind}: {start!r}): a captive portal (open any web page to log in) or a "
        f"proxy in the way? check the network and {advice}"
    )


def check_answer(response, url, have, size, advice):
    """Where the body goes: at `have` for a 206 that continues it, at 0 for a 200 (the whole file).
    A total other than the listing's size, or an HTML page (a captive portal's login): DataError."""
    if 'text/html' in response.headers.get('Content-Type', ''):
        page = next(response.iter_content(200), b'')
        raise not_the_file(url, "the server answered with a web page", response, page, advice)
    total, start = response.headers.get('Content-Length'), 0
    if response.status_code == 206:
        match = re.fullmatch(r'bytes (\d+)-\d+/(\d+|\*)', response.headers.get('Content-Range', ''))
        if not match or int(match[1]) != have:
            raise DataError(
                f"{url}: asked for bytes {have:,}- but the server sent "
                f"{response.headers.get('Content-Range')!r}: check {advice}"
            )
        total, start = match[2], have
    if total not in (None, '*') and int(total) != size:
        raise size_mismatch(url, f"{int(total):,}", size, advice)
    return start
