"""setup.py lists the rooms' subpackages by hand (package_dir maps each folder into
`zerolayer.*`), so a new folder that is not listed is left out of the wheel: the editable
install still finds it, and only the image or a user's pip install would fail. Every
folder with an __init__.py under the rooms is listed."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _listed(name: str) -> list[str]:
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name
                                                for t in node.targets):
            value = ast.literal_eval(node.value)
            return list(value)
    raise AssertionError(f"setup.py has no {name}")


def test_every_subpackage_of_the_rooms_is_in_the_wheel() -> None:
    rooms = _listed("ROOMS")
    found = {str(p.parent.relative_to(ROOT)).replace("/", ".")
             for room in rooms for p in (ROOT / room).rglob("__init__.py")}
    assert found - set(rooms) == set(_listed("SUBPACKAGES"))
