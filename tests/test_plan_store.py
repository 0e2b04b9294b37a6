"""Persisted plans (cpp/src/plan_store.cpp): what a new process may trust of a plan file.

A file is used only when it is whole, intact and written for the same graph-cache key and context
(cuDNN, GPU, driver, graph-building code); everything else reads as "not stored", is removed, and
counted. These tests drive the store through its test hooks with payloads of our own: no cuDNN and
no GPU. The GPU tests (tests/gpu/test_persisted_plans.py) load real cuDNN plans in new processes.
"""

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stridedfa import _core

KEY = (2, 1, 90, 91900, 16, 128, 128)
CONTEXT = "graphs abc; cudnn 91900; gpu NVIDIA H200 sm 90"
PAYLOAD = bytes(range(256)) * 40


def _save(directory, key=KEY, context=CONTEXT, payload=PAYLOAD, max_bytes=0):
    return _core._plan_store_save(str(directory), max_bytes, key, context, payload)


def _load(directory, key=KEY, context=CONTEXT):
    return _core._plan_store_load(str(directory), key, context)


def _plan_files(directory):
    return sorted(p for p in Path(directory).iterdir() if p.suffix == ".plan")


def test_a_saved_plan_loads_back_in_another_store(tmp_path):
    saved, info = _save(tmp_path)
    assert saved and info["saves"] == 1 and info["files"] == 1 and info["directory"] == str(tmp_path)
    payload, info = _load(tmp_path)
    assert payload == PAYLOAD
    assert info["loads"] == 1 and info["load_rejections"] == 0


def test_an_empty_payload_is_a_plan_too(tmp_path):
    assert _save(tmp_path, payload=b"")[0]
    assert _load(tmp_path)[0] == b""


def test_another_key_or_context_finds_nothing(tmp_path):
    _save(tmp_path)
    assert _load(tmp_path, key=KEY[:-1] + (64,))[0] is None
    assert _load(tmp_path, context=CONTEXT.replace("91900", "92100"))[0] is None  # another cuDNN
    assert _load(tmp_path)[0] == PAYLOAD  # the original is untouched


def test_a_file_of_another_key_under_this_name_is_rejected_and_removed(tmp_path):
    # What a hash collision, or a file copied under another name, looks like to the store.
    other = KEY[:-1] + (64,)
    _save(tmp_path, key=other, payload=b"the other plan")
    [foreign] = _plan_files(tmp_path)
    _save(tmp_path)
    [mine] = [p for p in _plan_files(tmp_path) if p != foreign]
    mine.write_bytes(foreign.read_bytes())
    payload, info = _load(tmp_path)
    assert payload is None and info["load_rejections"] == 1 and info["loads"] == 0
    assert not mine.exists(), "an untrusted file must be removed, so the next save replaces it"


@pytest.mark.parametrize("keep", [0, 7, 8, 31, 32, 100, -9, -1])
def test_a_truncated_file_is_rejected(tmp_path, keep):
    _save(tmp_path)
    [path] = _plan_files(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    payload, info = _load(tmp_path)
    assert payload is None and info["load_rejections"] == 1
    assert not path.exists()


def test_a_file_with_trailing_bytes_is_rejected(tmp_path):
    _save(tmp_path)
    [path] = _plan_files(tmp_path)
    path.write_bytes(path.read_bytes() + b"\0")
    assert _load(tmp_path)[0] is None


@pytest.mark.parametrize("where", ["magic", "lengths", "context", "key", "payload", "checksum"])
def test_a_corrupt_byte_anywhere_is_rejected(tmp_path, where):
    _save(tmp_path)
    [path] = _plan_files(tmp_path)
    data = bytearray(path.read_bytes())
    header = 8 + 3 * 8
    offset = {"magic": 3, "lengths": 8 + 16 + 1, "context": header + 5, "key": header + len(CONTEXT) + 9,
              "payload": header + len(CONTEXT) + 8 * len(KEY) + 1000, "checksum": len(data) - 2}[where]
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))
    payload, info = _load(tmp_path)
    assert payload is None and info["load_rejections"] == 1


def test_absurd_lengths_in_a_header_are_rejected_without_reading_past_the_file(tmp_path):
    _save(tmp_path)
    [path] = _plan_files(tmp_path)
    data = bytearray(path.read_bytes())
    for field in range(3):  # each length set to 2^64 - 1: the sizes must not overflow into "fits"
        corrupt = bytearray(data)
        corrupt[8 + 8 * field:16 + 8 * field] = b"\xff" * 8
        path.write_bytes(bytes(corrupt))
        assert _load(tmp_path)[0] is None


def test_a_file_that_is_not_a_plan_is_rejected(tmp_path):
    _save(tmp_path)
    [path] = _plan_files(tmp_path)
    path.write_bytes(b"not a plan at all" * 100)
    assert _load(tmp_path)[0] is None


def test_the_size_bound_evicts_least_recently_used_plans(tmp_path):
    payload = b"x" * 1000
    for i in range(4):
        assert _save(tmp_path, key=(i,), payload=payload, max_bytes=5000)[0]
    for p in _plan_files(tmp_path):  # every file old; the one read below becomes the most recent
        os.utime(p, (1, 1))
    assert _load(tmp_path, key=(0,))[0] == payload  # now the most recently used
    saved, info = _save(tmp_path, key=(4,), payload=payload, max_bytes=5000)
    assert saved and info["evictions"] >= 1
    assert info["bytes"] <= 5000
    assert _load(tmp_path, key=(0,))[0] == payload, "a recently loaded plan was evicted before older ones"
    assert _load(tmp_path, key=(4,))[0] == payload, "the plan just saved was evicted"


def test_a_plan_larger_than_the_bound_is_not_kept_and_evicts_nothing(tmp_path):
    for i in range(5):
        assert _save(tmp_path, key=(i,), payload=b"x" * 100, max_bytes=2000)[0]
    saved, info = _save(tmp_path, payload=b"y" * 10_000, max_bytes=2000)
    assert not saved and info["save_failures"] == 1 and info["saves"] == 0
    assert info["files"] == 5 and info["evictions"] == 0, "one oversized plan must not wipe the others"


def test_an_unwritable_directory_costs_a_save_not_the_call(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_bytes(b"")
    saved, info = _save(blocker / "plans")  # a directory that cannot be made under a file
    assert not saved and info["save_failures"] == 1 and info["saves"] == 0
    assert _load(blocker / "plans")[0] is None


def test_a_missing_directory_is_made_on_the_first_save_for_its_owner_alone(tmp_path):
    directory = tmp_path / "a" / "b" / "plans"
    assert _load(directory)[0] is None
    assert _save(directory)[0] and _load(directory)[0] == PAYLOAD
    assert directory.stat().st_mode & 0o777 == 0o700  # cuDNN executes what a plan holds


def test_clear_removes_plans_and_leftover_temporaries_only(tmp_path):
    _save(tmp_path)
    _save(tmp_path, key=(1,))
    (tmp_path / "0123456789abcdef.plan.tmp.4242.0").write_bytes(b"a writer that died")
    (tmp_path / "notes.txt").write_text("not ours")
    assert _core._plan_store_clear(str(tmp_path)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def _writer(directory, payload, rounds):
    for _ in range(rounds):
        _core._plan_store_save(directory, 0, KEY, CONTEXT, payload)


def _reader(directory, payloads, rounds, queue):
    seen = set()
    for _ in range(rounds):
        data, _ = _core._plan_store_load(directory, KEY, CONTEXT)
        if data is not None and data not in payloads:
            queue.put("torn")
            return
        seen.add(None if data is None else payloads.index(data))
    queue.put(sorted(seen, key=str))


def test_several_processes_writing_one_key_leave_one_whole_plan(tmp_path):
    # Four processes save different payloads under one key while two read it: every read is one
    # whole payload or nothing, and what is left is one whole payload and no temporary file.
    directory = str(tmp_path)
    payloads = [bytes([i]) * (50_000 + i) for i in range(4)]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    writers = [context.Process(target=_writer, args=(directory, p, 60)) for p in payloads]
    readers = [context.Process(target=_reader, args=(directory, payloads, 200, queue)) for _ in range(2)]
    for p in writers + readers:
        p.start()
    results = [queue.get(timeout=120) for _ in readers]
    for p in writers + readers:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert "torn" not in results, "a reader saw a partly written plan"
    assert _load(tmp_path)[0] in payloads
    assert [p.name for p in tmp_path.iterdir() if ".tmp." in p.name] == []


def _process_info(env_changes, code="import stridedfa, json; print(json.dumps(stridedfa.cache_info()['persistent']))"):
    env = {k: v for k, v in os.environ.items()
           if k not in ("STRIDEDFA_CACHE_DIR", "STRIDEDFA_PERSISTENT_CACHE", "XDG_CACHE_HOME")}
    env.update(env_changes)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_directory_comes_from_the_environment(tmp_path):
    assert _process_info({"STRIDEDFA_CACHE_DIR": str(tmp_path / "mine")})["directory"] == str(tmp_path / "mine")
    assert _process_info({"XDG_CACHE_HOME": str(tmp_path)})["directory"] == str(tmp_path / "stridedfa" / "plans")
    home = _process_info({"HOME": str(tmp_path)})
    assert home["directory"] == str(tmp_path / ".cache" / "stridedfa" / "plans")
    assert home["max_bytes"] == 1 << 30
    for value in ("0", "off", "False", "no"):
        off = _process_info({"STRIDEDFA_CACHE_DIR": str(tmp_path), "STRIDEDFA_PERSISTENT_CACHE": value})
        assert off["directory"] is None and off["files"] == 0, value
    assert _process_info({"STRIDEDFA_CACHE_MAX_BYTES": "12345"})["max_bytes"] == 12345
    for value in ("2e9", "1GiB", "-5", ""):  # not a plain byte count: the default, never a tiny bound
        assert _process_info({"STRIDEDFA_CACHE_MAX_BYTES": value})["max_bytes"] == 1 << 30, value


def test_cache_clear_persistent_empties_the_directory(tmp_path):
    _save(tmp_path)
    code = ("import stridedfa, json; files = lambda: stridedfa.cache_info()['persistent']['files']; "
            "stridedfa.cache_clear(); a = files(); stridedfa.cache_clear(persistent=True); "
            "print(json.dumps([a, files()]))")
    assert _process_info({"STRIDEDFA_CACHE_DIR": str(tmp_path)}, code) == [1, 0]
    assert _plan_files(tmp_path) == []
