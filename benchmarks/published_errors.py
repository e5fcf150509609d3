"""Write the shipped runs' step-time errors that estimates of the same model on the same hardware cite.

    python benchmarks/published_errors.py

Predicts every shipped run as `hyperplan calibrate` does (the presets as fitted: run
benchmarks/fit_presets.py first after a change of the cost model) and writes
planner/calibration/published_errors.json (`planner.calibration.published`);
tests/test_calibration.py checks the file against the predictions. Takes about a minute.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.api import calibrate  # noqa: E402
from planner.calibration.published import ERRORS, errors_table  # noqa: E402


def main() -> int:
    result = calibrate()
    if result.skipped:
        print("runs that could not be predicted:\n  " + "\n  ".join(result.skipped), file=sys.stderr)
        return 1
    table = errors_table(result.predictions)
    ERRORS.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {ERRORS} ({len(table['runs'])} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
