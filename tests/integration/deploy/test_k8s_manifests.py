#!/usr/bin/env python3
"""deploy/k8s: every manifest parses as Kubernetes objects that refer to each other correctly,
and the daemons accept what the manifests give them.

- each document has the apiVersion its kind needs, a DNS-1123 name, and the fields a workload
  needs (selector labels found in the pod template, containers with image and command, probe
  ports that are container ports, volume mounts of declared volumes, config maps, services
  and claims that the set defines);
- every file of every ConfigMap passes `tycho check-config --role ROLE` (the role from its
  "# role:" line), and the daemon each workload runs, given the very command line of the
  manifest (pod fields filled in), accepts it with --check-config.

Usage: test_k8s_manifests.py SOURCE_DIR BUILD_DIR. Exits 77 without PyYAML."""
import os
import re
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("skip: no PyYAML (python3-yaml)")
    sys.exit(77)

SRC, BUILD = sys.argv[1], sys.argv[2]
K8S = os.path.join(SRC, "deploy/k8s")
TYCHO = os.path.join(BUILD, "src/cli/tycho")
DAEMONS = {"tycho-conductor": "src/conductor/tycho-conductor",
           "tycho-prefill": "src/prefill/tycho-prefill",
           "tycho-decode": "src/decode/tycho-decode", "tycho-store": "src/store/tycho-store"}
API = {"ConfigMap": "v1", "Service": "v1", "PersistentVolumeClaim": "v1", "Secret": "v1",
       "Deployment": "apps/v1", "StatefulSet": "apps/v1",
       "Kustomization": "kustomize.config.k8s.io/v1beta1"}
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
fails = 0


def check(cond, what):
    global fails
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    fails += not cond


docs = []
for f in sorted(os.listdir(K8S)):
    if f.endswith(".yaml"):
        with open(os.path.join(K8S, f)) as fh:
            for d in yaml.safe_load_all(fh):
                if d is not None:
                    docs.append((f, d))
check(len(docs) >= 10, "%d documents in deploy/k8s" % len(docs))
by_kind = {}
for f, d in docs:
    kind = d.get("kind")
    check(kind in API and d.get("apiVersion") == API[kind],
          "%s: %s has apiVersion %s" % (f, kind, d.get("apiVersion")))
    if kind == "Kustomization":
        listed = set(d.get("resources", []))
        want = {x for x in os.listdir(K8S) if x.endswith(".yaml") and x != f}
        check(listed == want, "%s lists every manifest: %s" % (f, sorted(listed ^ want) or "yes"))
        continue
    name = (d.get("metadata") or {}).get("name", "")
    check(NAME.match(name) and len(name) <= 63, "%s: %s name %r" % (f, kind, name))
    by_kind.setdefault(kind, {})[name] = d

roles = 0
with tempfile.TemporaryDirectory() as tmp:
    for name, cm in by_kind.get("ConfigMap", {}).items():
        for key, text in (cm.get("data") or {}).items():
            m = re.search(r"^# role: (\w+)$", text, re.M)
            check(m is not None, "ConfigMap %s/%s says its role" % (name, key))
            if not m:
                continue
            path = os.path.join(tmp, name + "-" + key)
            with open(path, "w") as fh:
                fh.write(text)
            r = subprocess.run([TYCHO, "check-config", "--role", m.group(1), "--config", path],
                               capture_output=True, text=True)
            check(r.returncode == 0, "ConfigMap %s/%s passes check-config --role %s: %s" %
                  (name, key, m.group(1), (r.stdout + r.stderr).strip()))
            roles += 1
    check(roles >= 5, "%d config files checked" % roles)

    for kind in ("Deployment", "StatefulSet"):
        for name, w in by_kind.get(kind, {}).items():
            spec = w["spec"]
            tmpl = spec["template"]
            labels = tmpl["metadata"]["labels"]
            sel = spec["selector"]["matchLabels"]
            check(all(labels.get(k) == v for k, v in sel.items()),
                  "%s %s: the selector matches its pods' labels" % (kind, name))
            if kind == "StatefulSet":
                check(spec.get("serviceName") in by_kind.get("Service", {}),
                      "StatefulSet %s: its service %s is defined" % (name,
                                                                     spec.get("serviceName")))
            pod = tmpl["spec"]
            vols = {v["name"]: v for v in pod.get("volumes", [])}
            vols.update({v["metadata"]["name"]: v for v in spec.get("volumeClaimTemplates", [])})
            for v in vols.values():
                cmn = (v.get("configMap") or {}).get("name")
                pvc = (v.get("persistentVolumeClaim") or {}).get("claimName")
                check(cmn is None or cmn in by_kind.get("ConfigMap", {}),
                      "%s %s: config map %s is defined" % (kind, name, cmn))
                check(pvc is None or pvc in by_kind.get("PersistentVolumeClaim", {}),
                      "%s %s: claim %s is defined" % (kind, name, pvc))
            for c in pod["containers"]:
                ports = {p.get("name") for p in c.get("ports", [])} | \
                        {p["containerPort"] for p in c.get("ports", [])}
                check(c.get("image") and c.get("command"),
                      "%s %s/%s: image and command" % (kind, name, c["name"]))
                for pr in ("livenessProbe", "readinessProbe"):
                    p = c.get(pr)
                    if p:
                        h = p.get("httpGet") or p.get("tcpSocket") or {}
                        check(h.get("port") in ports, "%s %s: %s port %s is a container port"
                              % (kind, name, pr, h.get("port")))
                for vm in c.get("volumeMounts", []):
                    check(vm["name"] in vols, "%s %s: volume %s is declared" %
                          (kind, name, vm["name"]))
                cmd = c["command"]
                daemon = os.path.basename(cmd[0])
                if daemon not in DAEMONS:
                    continue
                # the manifest's command line, with the config from its ConfigMap and the pod
                # fields filled in, is accepted by the daemon itself
                mount = next(vm for vm in c["volumeMounts"] if vm["mountPath"] == "/etc/tycho")
                cmname = vols[mount["name"]]["configMap"]["name"]
                args = []
                for a in cmd[1:]:
                    if a.startswith("/etc/tycho/"):
                        cfg = by_kind["ConfigMap"][cmname]["data"][os.path.basename(a)]
                        a = os.path.join(tmp, "cmd-" + os.path.basename(a))
                        with open(a, "w") as fh:
                            fh.write(cfg)
                    args.append(a.replace("$(POD_NAME)", name + "-0")
                                .replace("$(POD_IP)", "10.1.2.3"))
                r = subprocess.run([os.path.join(BUILD, DAEMONS[daemon]), *args,
                                    "--check-config"], capture_output=True, text=True)
                check(r.returncode == 0, "%s %s: `%s %s --check-config`: %s" %
                      (kind, name, daemon, " ".join(args[2:]), (r.stdout + r.stderr).strip()))
    for name, svc in by_kind.get("Service", {}).items():
        sel = svc["spec"].get("selector", {})
        pods = [w["spec"]["template"]["metadata"]["labels"] for k in ("Deployment", "StatefulSet")
                for w in by_kind.get(k, {}).values()]
        check(any(all(l.get(k) == v for k, v in sel.items()) for l in pods),
              "Service %s selects pods of a workload" % name)
sys.exit(1 if fails else 0)
