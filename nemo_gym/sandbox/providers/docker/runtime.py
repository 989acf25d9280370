"""The container runtime the ``docker`` provider drives, its settings, and images built on this machine.

Podman comes first when it is on PATH, Docker otherwise. Podman needs no daemon, so nothing has to be started and a
container's exit code comes back through its own CLI (a Docker CLI talking to podman's socket loses it on
``run --rm``); a Docker CLI with no daemon behind it is a common sight on machines that do have podman. The provider
therefore drives the CLI, not the Engine API: one ``podman exec`` per command costs ~0.1 s and leaves nothing running,
where an API exec leaves a ``conmon`` behind for minutes.

Two podman settings are written to a file of ours and passed through ``CONTAINERS_CONF`` (only when the user has not
set that variable): default ulimits that a shell without ``CAP_SYS_RESOURCE`` can grant (podman's defaults ask for
more and every ``run`` fails), and ``runc`` as the OCI runtime where it is installed (crun refuses hybrid cgroup
layouts).

No image registry is needed: the base image is made from the Debian packages apt already uses (``mmdebstrap`` piped
into ``podman import``), and task images are built ``FROM`` it with their files copied in, each tagged by a hash of
what went into it, so a second use is an ``image exists`` check.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nemo_gym.errors import SandboxCreateError

__all__ = [
    "BASE_IMAGE",
    "BASE_PACKAGES",
    "ContainerRuntime",
    "ContainerRuntimeError",
    "RUNTIME_HINT",
    "base_image_tag",
    "build_image",
    "ensure_base_image",
    "find_runtime",
    "image_exists",
    "image_tag_for_files",
]

BASE_IMAGE = "localhost/nemo-gym-base"
BASE_PACKAGES = ("python3", "python3-pytest", "git", "ca-certificates", "coreutils")
"""What every image built here starts from: enough to run a Python repository's tests and apply patches."""
RUNTIME_HINT = (
    "install podman (`apt-get install podman runc mmdebstrap`, or `make containers`) or Docker Engine with its "
    "daemon running, or pick the local provider"
)
_PODMAN_SETTINGS = """# Written by nemo_gym (sandbox/providers/docker/runtime.py); passed to podman through CONTAINERS_CONF.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
{engine}"""


class ContainerRuntimeError(SandboxCreateError):
    """No usable container runtime, or an image could not be built."""


@dataclass(frozen=True)
class ContainerRuntime:
    """One container CLI (``podman`` or ``docker``) and the environment its commands run with."""

    binary: str
    kind: str
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    """Where its commands run: podman's conmon writes files (``oom``) into its working directory."""

    def command(self, *args: str) -> list[str]:
        return [self.binary, *args]

    def environ(self) -> dict[str, str]:
        """This process's environment with the runtime's own settings on top, for a subprocess."""
        return {**os.environ, **self.env}

    def run(self, *args: str, timeout_s: float = 120, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
        """A blocking runtime command (for setup code and the CLI, never on an event loop)."""
        return subprocess.run(
            self.command(*args),
            input=stdin.decode() if stdin is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=self.environ(),
            cwd=self.cwd,
            check=False,
        )


def scratch_dir() -> str:
    """A directory of ours for the runtime's working directory (made on first use)."""
    path = Path(tempfile.gettempdir()) / f"nemo-gym-containers-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return str(path)


def settings_path() -> Path:
    """Where podman's settings of ours live (``$XDG_CONFIG_HOME/nemo_gym/containers.conf``)."""
    root = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return root / "nemo_gym" / "containers.conf"


def write_podman_settings(path: Path | None = None) -> Path:
    """Write the settings file when it is missing or differs; returns its path. Idempotent."""
    path = path or settings_path()
    engine = '[engine]\nruntime = "runc"\n' if shutil.which("runc") else ""
    text = _PODMAN_SETTINGS.format(engine=engine)
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path


def find_runtime(preference: str = "auto") -> ContainerRuntime:
    """``podman`` first, then ``docker`` (``preference`` may name one); a one-line error when neither is there."""
    if preference not in ("auto", "podman", "docker"):
        raise ContainerRuntimeError(f"sandbox config create.runtime is {preference!r}; use auto, podman or docker")
    for kind in ("podman", "docker") if preference == "auto" else (preference,):
        binary = shutil.which(kind)
        if binary is None:
            continue
        env: dict[str, str] = {}
        if kind == "podman" and "CONTAINERS_CONF" not in os.environ:
            env["CONTAINERS_CONF"] = str(write_podman_settings())
        return ContainerRuntime(binary=binary, kind=kind, env=env, cwd=scratch_dir())
    wanted = "`podman` or `docker`" if preference == "auto" else f"`{preference}`"
    raise ContainerRuntimeError(f"docker sandbox provider: no {wanted} command on PATH; {RUNTIME_HINT}")


def image_exists(runtime: ContainerRuntime, image: str) -> bool:
    args = ("image", "exists", image) if runtime.kind == "podman" else ("image", "inspect", image)
    return runtime.run(*args, timeout_s=60).returncode == 0


def _apt_source() -> tuple[str, str]:
    """The Debian mirror and suite this machine's apt uses (deb.debian.org and bookworm when none is found)."""
    suite = "bookworm"
    with_release = Path("/etc/os-release")
    if with_release.is_file():
        found = re.search(r"^VERSION_CODENAME=(\w+)", with_release.read_text(encoding="utf-8"), re.MULTILINE)
        suite = found.group(1) if found else suite
    mirror = "http://deb.debian.org/debian"
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]
    for source in sources:
        text = source.read_text(encoding="utf-8") if source.is_file() else ""
        found = re.search(r"^URIs:\s*(\S+/debian)/?\s*$", text, re.MULTILINE) or re.search(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s", text, re.MULTILINE
        )
        if found:
            return found.group(1), suite
    return mirror, suite


def base_image_tag(packages: tuple[str, ...] = BASE_PACKAGES) -> str:
    """``localhost/nemo-gym-base:<hash of the recipe>``: a changed package list is a new image."""
    _, suite = _apt_source()
    digest = hashlib.sha256(" ".join([suite, *packages]).encode()).hexdigest()[:12]
    return f"{BASE_IMAGE}:{digest}"


def ensure_base_image(runtime: ContainerRuntime, packages: tuple[str, ...] = BASE_PACKAGES) -> str:
    """The base image's tag, built from Debian packages first when it is missing (~30 s, needs root)."""
    tag = base_image_tag(packages)
    if image_exists(runtime, tag):
        return tag
    if shutil.which("mmdebstrap") is None:
        raise ContainerRuntimeError(
            f"the base image {tag} is missing and `mmdebstrap` is not installed to build it; "
            "`apt-get install mmdebstrap` (or `make containers`)"
        )
    mirror, suite = _apt_source()
    include = ",".join(packages)
    debootstrap = subprocess.Popen(
        ["mmdebstrap", "--variant=apt", f"--include={include}", suite, "-", mirror],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        imported = subprocess.run(
            runtime.command("import", "-", tag),
            stdin=debootstrap.stdout,
            capture_output=True,
            text=True,
            timeout=900,
            env=runtime.environ(),
            cwd=runtime.cwd,
            check=False,
        )
    finally:
        assert debootstrap.stdout is not None
        debootstrap.stdout.close()
        _, errors = debootstrap.communicate(timeout=60)
    if debootstrap.returncode != 0 or imported.returncode != 0:
        detail = (errors.decode(errors="replace") or imported.stderr).strip().splitlines()
        raise ContainerRuntimeError(
            f"building the base image {tag} from {mirror} ({suite}) failed: {detail[-1] if detail else 'no output'}"
        )
    return tag


def image_tag_for_files(name: str, base: str, files: Mapping[str, str], dockerfile_tail: str = "") -> str:
    """``localhost/<name>:<hash>`` of the base image, the files and the build steps: same content, same tag."""
    digest = hashlib.sha256()
    for part in (base, dockerfile_tail, *(f"{path}\0{files[path]}" for path in sorted(files))):
        digest.update(part.encode())
        digest.update(b"\1")
    return f"localhost/{name}:{digest.hexdigest()[:16]}"


def _context_tar(containerfile: str, files: Mapping[str, str], files_dir: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, text in {"Containerfile": containerfile, **{f"{files_dir}/{p}": t for p, t in files.items()}}.items():
            if path.startswith("/") or ".." in Path(path).parts:
                raise ValueError(f"image file path {path!r} must be relative and stay inside the image's directory")
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


_build_locks: dict[str, asyncio.Lock] = {}
_known_images: set[str] = set()
_base_images: dict[str, str] = {}


async def build_image(
    runtime: ContainerRuntime,
    name: str,
    files: Mapping[str, str],
    *,
    target_dir: str,
    base: str | None = None,
    run: str = "",
    timeout_s: float = 600,
) -> str:
    """The tag of an image ``FROM base`` with ``files`` at ``target_dir`` (and ``run`` as a build step), built once.

    Concurrent callers in this process wait for one build; the build itself runs in a worker thread.
    """
    base_tag: str = base if base is not None else await _base_once(runtime)
    tail = f"COPY files/ {target_dir}/\nWORKDIR {target_dir}\n" + (f"RUN {run}\n" if run else "")
    tag = image_tag_for_files(name, base_tag, files, tail)
    if tag in _known_images:
        return tag
    lock = _build_locks.setdefault(tag, asyncio.Lock())
    async with lock:
        if tag in _known_images or await asyncio.to_thread(image_exists, runtime, tag):
            _known_images.add(tag)
            return tag
        context = _context_tar(f"FROM {base_tag}\n{tail}", files, "files")
        built = await asyncio.to_thread(_build_from_tar, runtime, tag, context, timeout_s)
        if built.returncode != 0:
            lines = built.stderr.strip().splitlines()
            raise ContainerRuntimeError(f"building image {tag} failed: {lines[-1] if lines else 'no output'}")
        _known_images.add(tag)
    return tag


async def _base_once(runtime: ContainerRuntime) -> str:
    """:func:`ensure_base_image`, asked of the runtime once per process (images are not removed under a run)."""
    async with _build_locks.setdefault("", asyncio.Lock()):
        if runtime.binary not in _base_images:
            _base_images[runtime.binary] = await asyncio.to_thread(ensure_base_image, runtime)
    return _base_images[runtime.binary]


def _build_from_tar(
    runtime: ContainerRuntime, tag: str, context: bytes, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``build -t TAG -`` with the context as a tar on stdin (no temporary directory to clean up)."""
    completed = subprocess.run(
        runtime.command("build", "-q", "--network=none", "-t", tag, "-"),
        input=context,
        capture_output=True,
        timeout=timeout_s,
        env=runtime.environ(),
        cwd=runtime.cwd,
        check=False,
    )
    return subprocess.CompletedProcess(
        completed.args,
        completed.returncode,
        completed.stdout.decode(errors="replace"),
        completed.stderr.decode(errors="replace"),
    )
