"""Every test in this folder runs real processes, so every one is marked ``slow``.

``python -m pytest -m "not slow"`` leaves them out: the unit and integration layers alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    # a conftest hook sees the items of the whole session, not only this folder's
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slow)
