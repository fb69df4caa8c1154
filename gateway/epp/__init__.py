"""`kvgate epp`: kvgate's routing as a Gateway API Inference Extension endpoint picker,
an Envoy external processor (`envoy.service.ext_proc.v3`) that names the pod for each
request instead of forwarding it (docs/epp.md). Its modules are imported by name (the
gateway's metrics import `gateway.epp.metrics` without the server)."""
