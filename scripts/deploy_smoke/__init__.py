"""`make deploy-smoke`: the images run exactly as Kubernetes would run them,
driven by the rendered dev overlay.

Run it through scripts/deploy-smoke.sh, which installs podman, builds the
images (scripts/images.sh), provides kubectl and PyYAML, and starts the
smoke's own throwaway Postgres. What it does, in order:

1. Render deploy/overlays/dev with `kubectl kustomize`; admit every pod
   template as the namespace's Pod Security level would; read each pod's
   settings (image, command/args, environment from the ConfigMaps and the
   overlay's example Secrets, user, read-only root, capabilities, seccomp,
   memory, probes, grace period, preStop) from the render.
2. Run the migration Job's container to completion.
3. Start webhook-ingest and outbox-relay with those settings (podman), probe
   them on the kubelet's schedule, check from /proc that each process got
   its settings, and measure the cold start to ready.
4. Send signed webhooks through the Service's port (one by hand and its
   replay, then the simulated provider's duplicates, bursts and refunds),
   and audit the effects at the simulated downstream.
5. Stop the database: both become unready, neither fails liveness; start
   it: both ready again.
6. Stop the relay (SIGTERM, the grace period) with downstream calls under
   way, and the ingest (preStop, SIGTERM) with webhooks in flight: each
   exits 0 in time, nothing in flight is lost or left leased.
7. Its own test: three broken renders (a wrong readiness port, a root user,
   a missing variable), each of which must fail it for the right reason.

# Layout
- objects.py: the render, the example Secrets, the stand-ins for the cluster.
- admission.py: Pod Security admission and the kubelet's non-root check.
- pod.py: a rendered container as settings (fails on a field it cannot reproduce).
- podman.py: those settings as `podman run` arguments; /proc read back.
- kubelet.py: probes, termination (preStop, SIGTERM, grace), Job completion.
- neighbours.py: the smoke's Postgres, the simulated downstream, a lock.
- smoke.py: what the steps do with the pods (start, verify, stop, traffic, audit).
- scenario.py: the steps above, in order.
- breaks.py: the broken renders.
"""
