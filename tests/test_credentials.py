"""Credentials: file modes from the first byte on, no silent overwrites, ``--force``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flower_pfl.tools import credentials
from flower_pfl.tools.credentials import main, write_node_key, write_tls_certificates

ROOT = Path(__file__).resolve().parents[1]
TLS_MODES = {"ca": 0o644, "certificate": 0o644, "key": 0o600, "ca_key": 0o600}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0, 0o022, 0o077], ids=["umask-000", "umask-022", "umask-077"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


@pytest.fixture(scope="module")
def fast_rsa():
    """One RSA key generated once: the tests are about files, not keys."""
    key = credentials.rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(credentials, "_key", lambda: key)
        yield


def test_tls_modes_whatever_the_umask(tmp_path, umask, fast_rsa):
    paths = write_tls_certificates(tmp_path / "certs")
    assert {name: _mode(p) for name, p in paths.items()} == TLS_MODES


def test_node_key_modes_whatever_the_umask(tmp_path, umask):
    private, public = write_node_key(tmp_path / "keys" / "node0")
    assert (_mode(private), _mode(public)) == (0o600, 0o644)
    assert public.read_bytes().startswith(b"ecdsa-sha2-nistp384 ")


@pytest.mark.parametrize("force", [False, True], ids=["new", "force"])
def test_no_file_is_ever_wider_than_its_mode(tmp_path, monkeypatch, fast_rsa, force):
    """A watcher that looks at each file when its first byte is written sees the final mode already."""
    os.umask(0)  # the widest umask: os.open's mode alone would be kept
    if force:
        write_tls_certificates(tmp_path)
        write_node_key(tmp_path / "node")
    seen: dict[int, int] = {}
    real_write = os.write

    def watching_write(fd: int, data) -> int:
        seen.setdefault(os.fstat(fd).st_ino, stat.S_IMODE(os.fstat(fd).st_mode))
        return real_write(fd, data)

    monkeypatch.setattr(credentials.os, "write", watching_write)
    try:
        paths = write_tls_certificates(tmp_path, force=force)
        private, public = write_node_key(tmp_path / "node", force=force)
    finally:
        monkeypatch.undo()
        os.umask(0o022)
    expected = {p.stat().st_ino: mode for name, p in paths.items() for mode in [TLS_MODES[name]]}
    expected |= {private.stat().st_ino: 0o600, public.stat().st_ino: 0o644}
    assert seen == expected


def test_existing_files_are_refused_and_kept(tmp_path, fast_rsa):
    (tmp_path / "server.key").write_bytes(b"old key")
    with pytest.raises(FileExistsError, match=r"server\.key.*--force"):
        write_tls_certificates(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.key"]  # nothing else half-written
    assert (tmp_path / "server.key").read_bytes() == b"old key"

    (tmp_path / "node.pub").write_bytes(b"old public")
    with pytest.raises(FileExistsError, match=r"node\.pub.*--force"):
        write_node_key(tmp_path / "node")
    assert not (tmp_path / "node").exists() and (tmp_path / "node.pub").read_bytes() == b"old public"


def test_refusal_names_every_existing_file(tmp_path, fast_rsa):
    first = write_tls_certificates(tmp_path)
    before = {p: p.read_bytes() for p in first.values()}
    with pytest.raises(FileExistsError) as err:
        write_tls_certificates(tmp_path)
    assert all(str(p) in str(err.value) for p in first.values())
    assert {p: p.read_bytes() for p in first.values()} == before


def test_force_replaces(tmp_path, fast_rsa):
    (tmp_path / "server.key").write_bytes(b"old key")
    (tmp_path / "server.key").chmod(0o644)
    paths = write_tls_certificates(tmp_path, force=True)
    assert paths["key"].read_bytes().startswith(b"-----BEGIN RSA PRIVATE KEY-----") and _mode(paths["key"]) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "ca.key", "server.key", "server.pem"]  # no temporaries

    private, public = write_node_key(tmp_path / "node")
    old = private.read_bytes(), public.read_bytes()
    write_node_key(tmp_path / "node", force=True)
    assert private.read_bytes() != old[0] and public.read_bytes() != old[1]
    assert (_mode(private), _mode(public)) == (0o600, 0o644)


def test_cli_refuses_with_status_2_and_one_line(tmp_path, capsys, fast_rsa):
    main(["node-key", str(tmp_path / "node")])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["node-key", str(tmp_path / "node")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--force" in err and str(tmp_path / "node") in err
    main(["node-key", str(tmp_path / "node"), "--force"])
    main(["tls", str(tmp_path / "certs"), "--host", "example.org"])
    with pytest.raises(SystemExit) as exit_:
        main(["tls", str(tmp_path / "certs")])
    assert exit_.value.code == 2
    main(["tls", str(tmp_path / "certs"), "--force"])


def test_cli_process_exit_status_without_traceback(tmp_path):
    run = [sys.executable, "-m", "flower_pfl", "credentials", "node-key", str(tmp_path / "node")]
    assert subprocess.run(run, check=False, cwd=ROOT, capture_output=True).returncode == 0
    refused = subprocess.run(run, check=False, cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr and len(refused.stderr.splitlines()) == 1
