import pytest

from .runs import short_run


@pytest.fixture(scope="session")
def short_runs(tmp_path_factory):
    """``label -> short_run(label)``, each label run once per test process: methods are compared with
    references (FedAvg) that are run again, not read from the recording."""
    done: dict[str, dict] = {}

    def get(label: str) -> dict:
        if label not in done:
            done[label] = short_run(label, tmp_path_factory.mktemp(label.replace("+", "-")))
        return done[label]

    return get
