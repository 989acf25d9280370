"""The ``gitlab`` dataset registry: datasets as registered models of an MLflow model registry.

GitLab's model registry speaks the MLflow REST API, and so does a plain ``mlflow server``; both work. A dataset is a
registered model, a dataset version is a model version tagged ``gitlab.version: x.y.z``, and the files are artifacts
of the run behind that model version.

The two servers differ in one place. GitLab creates the run itself when a model version is created (its docs pass the
semantic version as the model version's source), and serves artifacts over plain HTTP with the token as a bearer
token. A plain MLflow server needs the run first and serves artifacts through its artifact proxy. Which one is talked
to is decided from the tracking URI (GitLab's ends in ``/api/v4/projects/<id>/ml/mlflow``).

Settings (env.yaml): ``mlflow_tracking_uri``, ``mlflow_tracking_token``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from nemo_gym.datasets.storage.base import (
    GITLAB_CREDENTIAL_KEYS,
    DatasetNotFoundError,
    RegistryError,
    check_target,
    require_keys,
    validate_artifact,
    validate_name,
    validate_version,
    version_key,
    write_atomically,
)

VERSION_TAG = "gitlab.version"
"""The model-version tag that holds the ``x.y.z`` dataset version (GitLab's own name for it)."""
SCRATCH_EXPERIMENT = "nemo_gym_datasets"
"""Experiment that holds the runs behind dataset versions on a plain MLflow server (GitLab makes its own)."""
CREDENTIALS_HINT = (
    " (mlflow_tracking_uri: https://<gitlab host>/api/v4/projects/<project id>/ml/mlflow/ and "
    "mlflow_tracking_token: a GitLab token with the api scope)"
)
DOWNLOAD_TIMEOUT_S = 300


def looks_like_gitlab(tracking_uri: str) -> bool:
    return "/api/v4/projects/" in tracking_uri and "/ml/mlflow" in tracking_uri


class MlflowDatasetRegistry:
    """Versioned datasets in an MLflow (GitLab) model registry."""

    storage = "gitlab"

    def __init__(self, tracking_uri: str, token: str, *, gitlab: bool | None = None) -> None:
        self.tracking_uri = tracking_uri.rstrip("/")
        self.token = token
        self.gitlab = looks_like_gitlab(self.tracking_uri) if gitlab is None else gitlab

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> MlflowDatasetRegistry:
        values = require_keys(config, GITLAB_CREDENTIAL_KEYS, "gitlab", CREDENTIALS_HINT)
        return cls(values["mlflow_tracking_uri"], values["mlflow_tracking_token"])

    # -- public API -----------------------------------------------------------------------------------------------

    def upload(
        self, name: str, version: str | None, file: Path, *, artifact: str | None = None, overwrite: bool = False
    ) -> str:
        name, version = validate_name(name), validate_version(version)
        artifact = validate_artifact(artifact or file.name)
        if not file.is_file():
            raise RegistryError(f"input file {file} does not exist")
        with self._session() as client:
            self._ensure_registered_model(client, name)
            existing = self._find_version(client, name, version)
            if existing is None:
                run_id = self._create_version(client, name, version)
            else:
                run_id = existing.run_id
                if not run_id:
                    raise RegistryError(f"{name} {version} in {self.tracking_uri} has no run to hold its files")
                if not overwrite and self._has_artifact(client, run_id, artifact):
                    raise RegistryError(
                        f"{name} {version} already has {artifact}; versions are meant to stay fixed. Upload a new "
                        "version, or pass --overwrite (+overwrite=true) to replace the file"
                    )
            self._log_artifact(client, run_id, file, artifact)
        return f"{self.tracking_uri} model {name} version {version} ({artifact})"

    def download(self, name: str, version: str | None, artifact: str, dest: Path, *, overwrite: bool = False) -> Path:
        name, version, artifact = validate_name(name), validate_version(version), validate_artifact(artifact)
        check_target(dest, overwrite)
        with self._session() as client:
            found = self._find_version(client, name, version)
            if found is None:
                raise DatasetNotFoundError(
                    f"dataset {name!r} has no version {version} in {self.tracking_uri} "
                    f"(has: {', '.join(self._versions(client, name)) or 'none'})"
                )
            if not found.run_id:
                raise RegistryError(f"{name} {version} in {self.tracking_uri} has no run holding its files")
            if self.gitlab:
                run = self._call(client.get_run, found.run_id)
                url = f"{run.info.artifact_uri.rstrip('/')}/{artifact}"
                return write_atomically(dest, overwrite, lambda temporary: self._http_get(url, temporary))
            return write_atomically(
                dest, overwrite, lambda temporary: self._fetch_artifact(found.run_id, artifact, temporary)
            )

    def delete(self, name: str, version: str | None = None) -> None:
        """Delete one version or the registered model; on a plain MLflow server also the runs that held the files."""
        name = validate_name(name)
        with self._session() as client:
            if version is None:
                self._call(client.get_registered_model, name)
                run_ids = [mv.run_id for mv in self._all_versions(client, name)]
                self._call(client.delete_registered_model, name)
            else:
                version = validate_version(version)
                found = self._find_version(client, name, version)
                if found is None:
                    raise DatasetNotFoundError(f"dataset {name!r} has no version {version} in {self.tracking_uri}")
                run_ids = [found.run_id]
                self._call(client.delete_model_version, name, found.version)
            if not self.gitlab:  # GitLab removes a version's run together with the version
                for run_id in filter(None, run_ids):
                    with contextlib.suppress(Exception):
                        client.delete_run(run_id)

    def list_versions(self, name: str) -> list[str]:
        name = validate_name(name)
        with self._session() as client:
            return self._versions(client, name)

    # -- internals ------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _session(self) -> Iterator[Any]:
        """A client with the token in ``MLFLOW_TRACKING_TOKEN`` (where MLflow reads it) and MLflow's chatter quiet.

        The environment and log level are restored afterwards, so the token does not leak into servers or subprocesses
        that the same process starts later.
        """
        try:
            from mlflow import MlflowClient
        except ImportError as e:
            raise RegistryError(
                "the gitlab dataset registry needs the MLflow client: pip install 'nemo-gym[registries]' "
                f"(mlflow-skinny) ({e})"
            ) from e
        settings = {
            "MLFLOW_TRACKING_TOKEN": self.token,
            "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # no "View run ..." line per run
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        }
        previous = {key: os.environ.get(key) for key in settings}
        logger = logging.getLogger("mlflow")
        previous_level = logger.level
        os.environ.update(settings)
        logger.setLevel(logging.WARNING)
        try:
            yield MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        finally:
            logger.setLevel(previous_level)
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the client, turning MLflow's errors into one-line registry errors."""
        from mlflow.exceptions import MlflowException

        try:
            return method(*args, **kwargs)
        except MlflowException as e:
            raise self._translate(e) from e

    def _translate(self, error: Any) -> RegistryError:
        message = str(getattr(error, "message", error)).splitlines()[0]
        if getattr(error, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
            return DatasetNotFoundError(f"{self.tracking_uri}: {message}")
        return RegistryError(f"the gitlab dataset registry at {self.tracking_uri} failed: {message}")

    def _ensure_registered_model(self, client: Any, name: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            client.create_registered_model(name)
        except MlflowException as e:
            if getattr(e, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                raise self._translate(e) from e

    def _all_versions(self, client: Any, name: str) -> list[Any]:
        from mlflow.exceptions import MlflowException

        try:
            return list(client.search_model_versions(f"name='{name}'"))
        except MlflowException as e:
            if getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                return []
            raise self._translate(e) from e

    @staticmethod
    def _label(model_version: Any) -> str:
        return str((model_version.tags or {}).get(VERSION_TAG) or model_version.version)

    def _versions(self, client: Any, name: str) -> list[str]:
        labels = {self._label(mv) for mv in self._all_versions(client, name)}
        valid = [label for label in labels if label.count(".") == 2 and label.replace(".", "").isdigit()]
        return sorted(valid, key=version_key)

    def _find_version(self, client: Any, name: str, version: str) -> Any | None:
        return next((mv for mv in self._all_versions(client, name) if self._label(mv) == version), None)

    def _create_version(self, client: Any, name: str, version: str) -> str:
        """Create model version ``version`` and return the id of the run that holds its files."""
        tags = {VERSION_TAG: version}
        if self.gitlab:
            created = self._call(client.create_model_version, name, version, tags=tags)
            if not created.run_id:
                raise RegistryError(f"{self.tracking_uri} created {name} {version} without a run to hold its files")
            return created.run_id
        experiment = client.get_experiment_by_name(SCRATCH_EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment else self._create_experiment(client)
        run = self._call(client.create_run, experiment_id, tags={"nemo_gym.dataset": name, "nemo_gym.version": version})
        run_id = run.info.run_id
        created = self._call(client.create_model_version, name, run.info.artifact_uri, run_id=run_id, tags=tags)
        self._call(client.set_terminated, run_id)
        return created.run_id or run_id

    def _create_experiment(self, client: Any) -> str:
        from mlflow.exceptions import MlflowException

        try:
            return client.create_experiment(SCRATCH_EXPERIMENT)
        except MlflowException:
            experiment = self._call(client.get_experiment_by_name, SCRATCH_EXPERIMENT)
            if experiment is None:
                raise
            return experiment.experiment_id

    def _has_artifact(self, client: Any, run_id: str, artifact: str) -> bool:
        """Whether the run already holds ``artifact``; best effort (an unlistable store counts as "no")."""
        parent = str(PurePosixPath(artifact).parent)
        try:
            listed = client.list_artifacts(run_id, None if parent == "." else parent)
        except Exception:
            return False
        return any(item.path == artifact for item in listed)

    def _log_artifact(self, client: Any, run_id: str, file: Path, artifact: str) -> None:
        """MLflow names an artifact after the local file, so stage a copy under the artifact's file name."""
        path = PurePosixPath(artifact)
        directory = None if str(path.parent) == "." else str(path.parent)
        with tempfile.TemporaryDirectory(prefix="nemo_gym_upload_") as staging:
            staged = Path(staging) / path.name
            shutil.copyfile(file, staged)
            self._call(client.log_artifact, run_id, str(staged), directory)

    def _fetch_artifact(self, run_id: str, artifact: str, temporary: Path) -> None:
        import mlflow.artifacts

        with tempfile.TemporaryDirectory(prefix="nemo_gym_download_", dir=temporary.parent) as staging:
            local = self._call(
                mlflow.artifacts.download_artifacts,
                run_id=run_id,
                artifact_path=artifact,
                dst_path=staging,
                tracking_uri=self.tracking_uri,
            )
            if not Path(local).is_file():
                raise DatasetNotFoundError(f"{artifact!r} in run {run_id} is not a file")
            os.replace(local, temporary)

    def _http_get(self, url: str, temporary: Path) -> None:
        """GitLab serves a version's files at ``<run artifact URI>/<file>`` to a bearer token."""
        import requests

        try:
            with requests.get(
                url, headers={"Authorization": f"Bearer {self.token}"}, stream=True, timeout=DOWNLOAD_TIMEOUT_S
            ) as response:
                if response.status_code == 404:
                    raise DatasetNotFoundError(f"{url} does not exist")
                if response.status_code in (401, 403):
                    raise RegistryError(f"{url}: access denied ({response.status_code}); check mlflow_tracking_token")
                response.raise_for_status()
                with temporary.open("wb") as f:
                    for chunk in response.iter_content(chunk_size=1 << 20):
                        f.write(chunk)
        except requests.RequestException as e:
            raise RegistryError(f"downloading {url} failed: {e}") from e
