"""Turns a published CustomResourceDefinition into the schema file
deploy-check reads (see README.md beside this file):

    python3 extract.py VERSION "OWNER/REPO TAG PATH" < crd.yaml > GROUP_kind.json
"""

import json
import sys

import yaml


def without_descriptions(value):
    if isinstance(value, dict):
        return {k: without_descriptions(v) for k, v in value.items() if k != "description"}
    if isinstance(value, list):
        return [without_descriptions(v) for v in value]
    return value


def main() -> None:
    version, source = sys.argv[1], sys.argv[2]
    crd = yaml.safe_load(sys.stdin)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    json.dump({
        "group": crd["spec"]["group"],
        "version": version,
        "kind": crd["spec"]["names"]["kind"],
        "source": source,
        "openAPIV3Schema": without_descriptions(served["schema"]["openAPIV3Schema"]),
    }, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
