"""The README's example is code a developer will paste: it must run and say what it claims."""

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_guard_example_runs_and_prints_what_its_comment_promises() -> None:
    text = README.read_text(encoding="utf-8")
    block = re.search(r"## The guard in 20 lines\s+```python\n(.*?)```", text, re.S)
    assert block is not None, "the README lost its guard example"
    code = block.group(1)
    promised = re.search(r"print\(.*\)\s+# (.+)$", code, re.M)
    assert promised is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - our own README
    assert out.getvalue().strip() == promised.group(1).strip()
