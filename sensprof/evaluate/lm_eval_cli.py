"""`sensprof-lm-eval ...` (or `python -m sensprof.evaluate.lm_eval_cli ...`): lm-eval's own command line, with the
`sensprof` model type registered first.

lm-eval 0.4 finds models only in its own table (lm_eval/models/__init__.py's MODEL_MAPPING) or in modules
already imported; it reads no entry points and its --include_path holds tasks, not models. So the plain `lm_eval`
command cannot know `--model sensprof`; this one is the same command with the registration imported.
"""

from __future__ import annotations

import importlib
import sys

from ..errors import SensprofError

PROG = "sensprof-lm-eval"


def main(argv: list[str] | None = None) -> int:
    try:
        from .lm_eval_run import require_lm_eval

        require_lm_eval()
        importlib.import_module(f"{__package__}.lm_eval_model")  # registers --model sensprof
        from lm_eval.__main__ import cli_evaluate

        sys.argv = [PROG, *(sys.argv[1:] if argv is None else argv)]
        cli_evaluate()
    except SensprofError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # lm-eval's own word on its arguments (e.g. "Tasks not found: ..."), as one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"{PROG}: error: {first}; see `{PROG} --help`", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
