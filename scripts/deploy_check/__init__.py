"""deploy-check: the manifests under deploy/ rendered, validated and checked
against the code. See __main__.py; run scripts/deploy-check.sh."""
