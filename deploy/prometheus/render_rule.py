"""Write deploy/k8s/prometheusrule.yaml from deploy/prometheus/rules.yml (run after editing it).

The rules stay in one file; the Kubernetes PrometheusRule wraps the same groups.
A test fails when the two differ.
"""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yml"
TARGET = HERE.parent / "k8s" / "prometheusrule.yaml"


def render() -> str:
    """The PrometheusRule manifest for the groups of rules.yml."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "inorder"},
        "spec": {"groups": groups},
    }
    header = "# Generated from deploy/prometheus/rules.yml by deploy/prometheus/render_rule.py.\n"
    return header + yaml.safe_dump(manifest, sort_keys=False, width=100)


if __name__ == "__main__":
    TARGET.write_text(render())
