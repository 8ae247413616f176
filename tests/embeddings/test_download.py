"""Model resolution and download against a real HTTP server on 127.0.0.1 serving a model repo.

The server speaks the two Hugging Face endpoints the downloader uses: the listing
``/api/models/{repo}/revision/{rev}`` and ``/{repo}/resolve/{commit}/{file}`` (the ONNX file
through a redirect, as the hub serves large files). A malicious variant lists names that would
land outside the cache; nothing may be written then, inside the cache or out.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

from sunroom.embeddings import OnnxEmbedder, models, resolve_model
from sunroom.errors import EmbeddingModelError, UsageError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "test-org/mini-lm"


@dataclass
class Repo:
    """What the fake hub serves for REPO."""

    files: Path
    listing: list[str]
    commit: str = COMMIT
    token: str | None = None  # when set, every request must carry it
    requests: list[str] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)


def _handler(repo: Repo) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/octet-stream") -> None:
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = unquote(self.path)
            repo.requests.append(path)
            repo.headers.append(self.headers.get("authorization") or "")
            if (
                repo.token is not None
                and self.headers.get("authorization") != f"Bearer {repo.token}"
            ):
                self._send(401, b"unauthorised")
                return
            if path in (
                f"/api/models/{REPO}/revision/main",
                f"/api/models/{REPO}/revision/{repo.commit}",
            ):
                body = {"sha": repo.commit, "siblings": [{"rfilename": n} for n in repo.listing]}
                self._send(200, json.dumps(body).encode(), "application/json")
                return
            prefix = f"/{REPO}/resolve/{repo.commit}/"
            if path.startswith(prefix):
                name = path[len(prefix) :]
                if name.endswith(".onnx"):  # large files come through a redirect
                    self.send_response(302)
                    self.send_header("location", f"/blobs/{name}")
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                self._file(name)
                return
            if path.startswith("/blobs/"):
                self._file(path[len("/blobs/") :])
                return
            self._send(404, b"not found")

        def _file(self, name: str) -> None:
            source = repo.files / name
            if ".." in name or not source.is_file():
                self._send(404, b"not found")
                return
            self._send(200, source.read_bytes())

    return Handler


@pytest.fixture
def hub(model_dir: Path) -> Iterator[tuple[str, Repo]]:
    listing = sorted(
        p.relative_to(model_dir).as_posix()
        for p in model_dir.rglob("*")
        if p.is_file() and p.name != ".complete"
    )
    repo = Repo(files=model_dir, listing=listing)

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            repo.errors.append(sys.exc_info()[1] or RuntimeError("unknown server error"))

    server = Server(("127.0.0.1", 0), _handler(repo))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", repo
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    # the only failure allowed in the server: a client that hung up mid-file (the size cap)
    assert all(isinstance(e, ConnectionError) for e in repo.errors), repo.errors


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


def test_download_into_the_hf_cache_layout_then_offline(
    tmp_path: Path, hub: tuple[str, Repo], embedder: OnnxEmbedder
) -> None:
    url, repo = hub
    cache = tmp_path / "hub"
    path = resolve_model(REPO, cache_dir=cache, endpoint=url)
    repo_dir = cache / "models--test-org--mini-lm"
    assert path == repo_dir / "snapshots" / COMMIT
    assert (repo_dir / "refs" / "main").read_text() == COMMIT
    for name in (
        "model.onnx",
        "tokenizer.json",
        "config.json",
        "1_Pooling/config.json",
        "modules.json",
    ):
        assert (path / name).read_bytes() == (repo.files / name).read_bytes()
    assert not (path / "SOURCE.md").exists()  # only the files an embedder reads
    assert not [p for p in _tree(cache) if "incomplete" in p]
    assert "/blobs/model.onnx" in repo.requests  # the redirect was followed
    # a second resolution reads the cache only
    count = len(repo.requests)
    assert resolve_model(REPO, cache_dir=cache, endpoint=url) == path
    assert resolve_model(f"{REPO}@{COMMIT}", cache_dir=cache, endpoint="http://127.0.0.1:9") == path
    assert len(repo.requests) == count
    # and the embedder reads the downloaded model like a local one
    with OnnxEmbedder(REPO, cache_dir=cache, endpoint="http://127.0.0.1:9") as emb:
        assert emb.name == REPO
        got = emb.embed(["a quick check"]).vectors
    assert np.abs(got - embedder.embed(["a quick check"]).vectors).max() < 1e-6


def test_a_pinned_commit_downloads_without_a_ref(tmp_path: Path, hub: tuple[str, Repo]) -> None:
    url, _ = hub
    path = resolve_model(f"{REPO}@{COMMIT}", cache_dir=tmp_path, endpoint=url)
    assert path == tmp_path / "models--test-org--mini-lm" / "snapshots" / COMMIT
    assert not (tmp_path / "models--test-org--mini-lm" / "refs").exists()


def test_cache_and_endpoint_from_the_environment(
    tmp_path: Path, hub: tuple[str, Repo], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = hub
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "envcache"))
    monkeypatch.setenv("HF_ENDPOINT", url)
    assert models.default_cache() == tmp_path / "envcache"
    path = resolve_model(REPO)
    assert path.is_relative_to(tmp_path / "envcache")
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert models.default_cache() == tmp_path / "home" / "hub"


def test_onnx_in_a_subdirectory_of_the_repo(tmp_path: Path, hub: tuple[str, Repo]) -> None:
    url, repo = hub
    files = tmp_path / "files"
    (files / "onnx").mkdir(parents=True)
    for name in repo.listing:
        target = files / ("onnx/model.onnx" if name == "model.onnx" else name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.hardlink_to(repo.files / name)
    repo.files = files
    repo.listing = [("onnx/model.onnx" if n == "model.onnx" else n) for n in repo.listing]
    path = resolve_model(REPO, cache_dir=tmp_path / "hub", endpoint=url)
    assert (path / "onnx" / "model.onnx").is_file()
    assert models.find_onnx(path) == path / "onnx" / "model.onnx"


@pytest.mark.parametrize(
    "evil",
    ["../../x", "/etc/x", "onnx/../../../x", "a\\..\\x", "a//b", "./x", "x\x00y", "C:/x", ""],
)
def test_a_malicious_listing_writes_nothing(
    tmp_path: Path, hub: tuple[str, Repo], evil: str
) -> None:
    url, repo = hub
    repo.listing = [*repo.listing, evil]
    cache = tmp_path / "deep" / "er" / "hub"
    with pytest.raises(EmbeddingModelError, match="outside the model directory|empty") as info:
        resolve_model(REPO, cache_dir=cache, endpoint=url)
    assert "Bearer" not in str(info.value)
    assert _tree(tmp_path) == []  # not even the cache directory was made
    assert not [r for r in repo.requests if "/resolve/" in r]  # refused before any file request


def test_a_symlinked_snapshot_cannot_lead_out_of_the_cache(
    tmp_path: Path, hub: tuple[str, Repo]
) -> None:
    url, _ = hub
    outside = tmp_path / "outside"
    outside.mkdir()
    cache = tmp_path / "hub"
    snapshots = cache / "models--test-org--mini-lm" / "snapshots"
    snapshots.mkdir(parents=True)
    (snapshots / COMMIT).symlink_to(outside)
    with pytest.raises(EmbeddingModelError, match="outside the cache"):
        resolve_model(REPO, cache_dir=cache, endpoint=url)
    assert _tree(outside) == []


def test_endpoint_errors_are_clear_and_keep_the_token_secret(
    tmp_path: Path, hub: tuple[str, Repo], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, repo = hub
    repo.token = "hf_right_token"
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_secret")
    with pytest.raises(EmbeddingModelError, match="answered 401") as info:
        resolve_model(REPO, cache_dir=tmp_path, endpoint=url)
    assert "hf_wrong_secret" not in str(info.value)
    assert repo.headers[-1] == "Bearer hf_wrong_secret"
    monkeypatch.setenv("HF_TOKEN", "hf_right_token")
    assert resolve_model(REPO, cache_dir=tmp_path, endpoint=url).is_dir()


def test_missing_pieces_in_the_repo(tmp_path: Path, hub: tuple[str, Repo]) -> None:
    url, repo = hub
    full = list(repo.listing)
    repo.listing = [n for n in full if n != "tokenizer.json"]
    with pytest.raises(EmbeddingModelError, match="no tokenizer.json"):
        resolve_model(REPO, cache_dir=tmp_path, endpoint=url)
    repo.listing = [n for n in full if n != "model.onnx"]
    with pytest.raises(EmbeddingModelError, match="no ONNX graph"):
        resolve_model(REPO, cache_dir=tmp_path, endpoint=url)
    repo.listing = [*full, "model.onnx_data"]  # listed but not served: a 404 mid-download
    with pytest.raises(EmbeddingModelError, match="answered 404 for model.onnx_data"):
        resolve_model(REPO, cache_dir=tmp_path, endpoint=url)
    assert not [p for p in _tree(tmp_path) if "incomplete" in p or p.endswith("onnx_data")]
    with pytest.raises(EmbeddingModelError, match="answered 404 for the listing"):
        resolve_model("test-org/other", cache_dir=tmp_path, endpoint=url)


def test_an_unreachable_endpoint(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingModelError, match="could not download test-org/mini-lm@main"):
        resolve_model(REPO, cache_dir=tmp_path, endpoint="http://127.0.0.1:9")


def test_a_file_over_the_size_limit_is_removed(
    tmp_path: Path, hub: tuple[str, Repo], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = hub
    monkeypatch.setattr(models, "MAX_FILE_BYTES", 1_000_000)  # model.onnx is ~90 MB
    with pytest.raises(EmbeddingModelError, match="larger than the 1000000 byte limit"):
        resolve_model(REPO, cache_dir=tmp_path, endpoint=url)
    assert not [p for p in _tree(tmp_path) if p.endswith(".onnx") or "incomplete" in p]


@pytest.mark.parametrize(
    "bad", ["no-slash", "a/b/c", "../x", "org/..", "org/name@../../x", "org/name@", "o/n@a b"]
)
def test_bad_model_names(tmp_path: Path, bad: str) -> None:
    with pytest.raises(UsageError, match="neither a local directory|not a branch, tag or commit"):
        resolve_model(bad, cache_dir=tmp_path, endpoint="http://127.0.0.1:9")
    assert _tree(tmp_path) == []
