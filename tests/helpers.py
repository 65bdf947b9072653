"""Helpers the test files share (imported as `helpers`: pytest puts tests/ on the path)."""


def write_config(path, keys):
    """A config file at `path` as a person writes one, a `key = value` line a key; -> its path as a str."""
    path.write_text(''.join(f'{k} = {v!r}\n' for k, v in keys.items()))
    return str(path)
