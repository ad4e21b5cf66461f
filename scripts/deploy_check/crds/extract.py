"""A published CRD into the schema deploy-check reads, without descriptions (README.md):
python3 extract.py VERSION "OWNER/REPO TAG PATH" < crd.yaml > GROUP_kind.json"""

import json
import sys

import yaml


def bare(value):
    if isinstance(value, dict):
        return {k: bare(v) for k, v in value.items() if k != "description"}
    return [bare(v) for v in value] if isinstance(value, list) else value


version, source, crd = sys.argv[1], sys.argv[2], yaml.safe_load(sys.stdin)
(served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
json.dump({"group": crd["spec"]["group"], "version": version, "kind": crd["spec"]["names"]["kind"],
           "source": source, "openAPIV3Schema": bare(served["schema"]["openAPIV3Schema"])},
          sys.stdout, indent=1, sort_keys=True)
print()
