"""Each setting names its environment variable once; ``environment_variables()`` lists
exactly the variables ``Settings.from_env`` reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import fields, is_dataclass

from portal.config import AUTH_KEY_VARIABLES, Settings, environment_variables


class Recording(Mapping[str, str]):
    """An empty environment that remembers every name asked for."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.asked.add(name)
        raise KeyError(name)

    def get(self, name: str, default=None):  # type: ignore[override]
        self.asked.add(name)
        return default

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def test_the_variables_listed_are_the_variables_read(tmp_path):
    environ = Recording()
    Settings.from_env(environ, str(tmp_path))
    # The numbered data keys are found by listing the environment, not by name.
    assert environment_variables() - {AUTH_KEY_VARIABLES} == environ.asked
    assert AUTH_KEY_VARIABLES in environment_variables()
    assert "SUBSCRIPTION_AUTH_KEY_VERSION" in environment_variables()


def test_every_setting_but_the_instance_path_names_a_variable():
    def unnamed(cls) -> list[str]:
        missing = []
        for item in fields(cls):
            if is_dataclass(item.default_factory):
                missing += unnamed(item.default_factory)
            elif "env" not in item.metadata:
                missing.append(f"{cls.__name__}.{item.name}")
        return missing

    assert unnamed(Settings) == ["Settings.instance_path"]


def test_each_variable_names_one_setting():
    names: list[str] = []

    def collect(cls) -> None:
        for item in fields(cls):
            if is_dataclass(item.default_factory):
                collect(item.default_factory)
            elif "env" in item.metadata:
                names.append(item.metadata["env"].name)

    collect(Settings)
    assert len(names) == len(set(names)) == len(environment_variables())


def test_a_variable_set_reaches_its_setting(tmp_path):
    settings = Settings.from_env(
        {"SWEEP_INTERVAL_SECONDS": "120", "BACKFILL_PAUSE_MS": "250", "REGION_HEADER": "X-R"},
        str(tmp_path),
    )
    assert settings.schedule.sweep == 120
    assert settings.backfill_pause_seconds == 0.25
    assert settings.region_header == "X-R"
    # Zero is "the default" for an interval, as before.
    assert Settings.from_env({"SWEEP_INTERVAL_SECONDS": "0"}, str(tmp_path)).schedule.sweep == 3600
