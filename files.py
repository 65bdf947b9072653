"""
files.py: writes that lose nothing. A file is written under a temporary name and renamed when complete, so a
reader (or a rerun after a crash) sees the old file or the new one, never half of one. Standard library only.
"""
import json
import os


def write_text_atomic(path, text):
    """Write to path.tmp, then rename: a reader sees the old file or the new one, never half of one."""
    with open(path + '.tmp', 'w') as f:
        f.write(text)
    os.replace(path + '.tmp', path)


def save_json(path, obj):
    write_text_atomic(path, json.dumps(obj, indent=1))
