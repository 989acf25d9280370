"""A NeMo Gym release as an unpacked wheel: its version, its Python floor, and the wheel packed again to install it.

NeMo Gym's wheel ships its core (``nemo_gym/``) and its server folders side by side, with a
``nemo_gym-<version>.dist-info/`` folder instead of a ``pyproject.toml``. Unpacked, it is a checkout for the migration
check (``gym env test --checkout DIR``) and, packed again, the control's framework (``--nemo-gym DIR``): the wheel is
rebuilt from the files its ``RECORD`` lists, so what is installed is exactly what was released, whatever else was
written into the directory since (venvs, caches, reports).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from nemo_gym.errors import UserError

DIST_INFO_GLOB = "nemo_gym-*.dist-info"


@dataclass(frozen=True)
class UnpackedWheel:
    """``root`` holds ``nemo_gym/`` and ``dist_info`` (``nemo_gym-<version>.dist-info``)."""

    root: Path
    dist_info: Path

    @property
    def version(self) -> str:
        return metadata_field(self.dist_info / "METADATA", "Version") or self.dist_info.name.split("-", 1)[1][:-10]

    @property
    def requires_python(self) -> str | None:
        """The lowest Python of its ``Requires-Python: >=X`` (``3.13.14``), or None."""
        spec = metadata_field(self.dist_info / "METADATA", "Requires-Python") or ""
        match = re.search(r">=\s*([\d.]+)", spec)
        return match.group(1) if match else None

    def requirement(self, name: str) -> str | None:
        """Its core's own requirement on ``name`` (``openai==2.44.0``), from ``Requires-Dist``, markers dropped."""
        try:
            text = (self.dist_info / "METADATA").read_text(encoding="utf-8")
        except OSError:
            return None
        for value in HeaderParser().parsestr(text, headersonly=True).get_all("Requires-Dist") or []:
            spec = str(value).split(";", 1)[0].strip()
            if re.match(rf"{re.escape(name)}(?![\w.-])", spec, re.IGNORECASE) and ";" not in str(value):
                return spec
        return None

    @property
    def tag(self) -> str:
        return metadata_field(self.dist_info / "WHEEL", "Tag") or "py3-none-any"

    def pack(self, cache_dir: Path) -> Path:
        """The wheel again, from the files its RECORD lists: ``<cache_dir>/wheels/<key>/<name>-<version>-<tag>.whl``.

        Built once per RECORD (the key hashes it and the directory); written to a temporary name and renamed.
        """
        record = self.dist_info / "RECORD"
        try:
            record_bytes = record.read_bytes()
        except OSError as e:
            raise UserError(
                f"{self.root}: cannot read {record} ({e.strerror or e}), so the wheel cannot be rebuilt"
            ) from None
        key = hashlib.sha256(str(self.root.resolve()).encode() + b"\0" + record_bytes).hexdigest()[:16]
        name = self.dist_info.name.removesuffix(".dist-info")
        target = cache_dir / "wheels" / key / f"{name}-{self.tag}.whl"
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        entries = [line.split(",", 1)[0] for line in record_bytes.decode("utf-8").splitlines() if line.strip()]
        fd, temporary = tempfile.mkstemp(dir=target.parent, suffix=".part")
        os.close(fd)
        try:
            with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED) as archive:
                for entry in entries:
                    path = self.root / entry
                    if not path.is_file():
                        raise UserError(f"{self.root}: {entry} is listed in {record.name} but missing")
                    archive.write(path, entry)
            os.replace(temporary, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        return target


def find_unpacked_wheel(directory: Path) -> UnpackedWheel | None:
    """The unpacked NeMo Gym wheel at ``directory`` (``nemo_gym/`` beside one ``nemo_gym-*.dist-info/``), or None."""
    if not (directory / "nemo_gym").is_dir():
        return None
    found = sorted(p for p in directory.glob(DIST_INFO_GLOB) if p.is_dir() and (p / "METADATA").is_file())
    return UnpackedWheel(directory, found[-1]) if found else None


def metadata_field(path: Path, field: str) -> str | None:
    """A ``Field: value`` header of a METADATA or WHEEL file, read as the email-style headers they are (a ``License``
    may run over many continuation lines, some of them only whitespace)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    value = HeaderParser().parsestr(text, headersonly=True).get(field)
    return str(value).strip() if value is not None else None


__all__ = ["UnpackedWheel", "find_unpacked_wheel", "metadata_field"]
