"""A processor that serves /healthz, /readyz and /metrics for Kubernetes."""

from ptb_fence import UpdateStore
from ptb_fence.ptb import FencedUpdateProcessor


def make_processor(store: UpdateStore) -> FencedUpdateProcessor:
    """The kubelet probes the pod's address, so listen on every interface."""
    return FencedUpdateProcessor(store, probe_port=9102, probe_host="0.0.0.0")
