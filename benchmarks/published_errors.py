"""Write the published errors that estimates cite: the shipped runs' step times, the serving deployments' rates.

    python benchmarks/published_errors.py

Predicts every shipped run as `hyperplan calibrate` does (the presets as fitted: run
benchmarks/fit_presets.py first after a change of the cost model) and writes
planner/calibration/published_errors.json (`planner.calibration.published`), which training
estimates of the same model on the same hardware cite; then estimates every published serving
deployment (planner/inference/published_deployments.json) and writes planner/inference/deployment_errors.json
(`planner.inference.deployments`), which serving plans cite. tests/test_calibration.py and
tests/test_inference_deployments.py check the files. Takes about a minute.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_models import load_cluster  # noqa: E402
from cost_models.loader import preset_names  # noqa: E402
from planner.api import calibrate  # noqa: E402
from planner.calibration.published import ERRORS, errors_table  # noqa: E402
from planner.inference import deployments  # noqa: E402
from planner.inference.validation import SHIPPED as DEPLOYMENTS, check_all  # noqa: E402


def deployment_table() -> dict:
    """Every published serving deployment estimated, with the efficiency fit its cluster uses."""
    doc = json.loads(DEPLOYMENTS.read_text(encoding="utf-8"))
    inline = doc.get("clusters", {})
    presets = set(preset_names())
    fits = {name: deployments.fit_of(name, inline, load_cluster(name).transferred_from if name in presets else "")
            for name in {r["cluster"] for r in doc["rows"]}}
    return deployments.errors_table(doc, check_all(DEPLOYMENTS), fits)


def main() -> int:
    result = calibrate()
    if result.skipped:
        print("runs that could not be predicted:\n  " + "\n  ".join(result.skipped), file=sys.stderr)
        return 1
    table = errors_table(result.predictions)
    ERRORS.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {ERRORS} ({len(table['runs'])} runs)")
    served = deployment_table()
    deployments.ERRORS.write_text(json.dumps(served, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {deployments.ERRORS} ({len(served['rows'])} deployments)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
