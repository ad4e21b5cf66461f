"""`make deploy-smoke`: the rendered dev overlay run by `podman kube play`,
with the checks that tie the manifests to the binaries.

Run it through scripts/deploy-smoke.sh, which installs podman, builds the
images (scripts/images.sh), provides kubectl and PyYAML, and starts the
smoke's own throwaway Postgres. What it does, in order:

1. Render deploy/overlays/dev (`kubectl kustomize`); the overlay's example
   Secrets, filled; the database their URLs name.
2. The migration Job's pod, to exit 0 (the migrations applied).
3. Each Deployment played (one replica): Ready by its readiness probe, live
   by its liveness probe, and from /proc, the settings the manifest gives
   (user, capabilities, no_new_privs, seccomp, read-only root, memory
   limit, every variable) as the process got them.
4. Signed webhooks through the Service's port (one by hand and its replay,
   then the simulated provider's duplicates, bursts and refunds): ingest ->
   outbox -> relay -> the simulated downstream, audited for exactly once.
5. The database stopped: both unready, both still live; started: Ready.
6. The relay stopped with downstream calls under way: within its grace
   period each finishes and is recorded, nothing is left leased.
7. Both stopped as a kubelet stops them: exit 0 within the grace period.
8. Its own test: three broken renders (breaks.py), each refused for its reason.

# The shim: what podman 4.3 cannot do, done here (each named where it is done)
1. Secrets (scenario.py): no kustomization lists them, so the overlay's
   example, REPLACE_ME filled; and podman 4.3 stores a `kind: Secret`
   document as YAML but reads it back as JSON ("secret ... is not valid
   JSON"), so each is made with `podman secret create`.
2. Addresses (manifests.py): no cluster DNS and no Postgres StatefulSet
   (podman 4.3 plays Pods and Deployments only): a URL to the Service
   `postgres` goes to the smoke's Postgres on the host's loopback, which a
   pod on slirp4netns (allow_host_loopback) reaches at 10.0.2.2; the
   overlay's `.invalid` API URLs go to the simulated downstream.
3. The Job (pods.py): podman 4.3 plays no Job; its pod template is played
   as a Pod (restartPolicy Never) and waited for.
4. Probes (pods.py): podman 4.3 turns liveness into a healthcheck running
   curl inside the container (none in distroless; a named port becomes 0)
   on systemd timers, and ignores readiness. Taken out of the played YAML;
   the smoke probes from the host.
5. Ports (pods.py): podman 4.3 publishes each containerPort at the same host
   port (two pods of one Deployment would both take it) and a slirp4netns
   pod has no address the host reaches: each containerPort, and each port a
   probe names, is published on 127.0.0.1 at a free port (hostPort, hostIP).
6. runAsNonRoot (pods.py): podman ignores it; the kubelet's check is made.
7. preStop and terminationGracePeriodSeconds (pods.py): podman 4.3 runs no
   lifecycle hook and stops after 10 s; the smoke sleeps the preStop, then
   `podman stop -t` the rest of the grace period.
Not reproduced: NetworkPolicy (podman cannot enforce it), kube-proxy (the
smoke follows the Service's selector and targetPort itself), Pod Security
admission, Service-link variables (the binaries read named variables only),
the scheduler's fields, replicas beyond one.

# Layout
- manifests.py: the render and its stand-ins (shims 1 and 2).
- pods.py: one workload under `podman kube play` (shims 3 to 7), /proc read back.
- neighbours.py: the smoke's Postgres and the simulated downstream.
- scenario.py: the steps above, in order.
- breaks.py: the broken renders.
"""
