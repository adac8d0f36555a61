"""Every label, annotation and environment key tokenyard writes or reads.

One module names them so that the operator (which writes them), the router and
the autoscaler (which select by them) and the simulator's pod runner (which
configures engines from them) cannot drift apart.
"""

GROUP = "tokenyard.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# --- labels on the pods and Services of a replica group ----------------------
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "tokenyard"
COMPONENT = "app.kubernetes.io/component"
COMPONENT_ENGINE = "engine"
MODEL_DEPLOYMENT = "tokenyard.dev/model-deployment"  # the ModelDeployment's name
REVISION = "tokenyard.dev/revision"  # the revision hash
GROUP_INDEX = "tokenyard.dev/group"  # "0", "1", ...
RANK = "tokenyard.dev/rank"  # "0" is the leader
ROLE = "tokenyard.dev/role"  # "leader" | "worker"
ROLE_LEADER = "leader"
ROLE_WORKER = "worker"

# --- node labels: the GPU topology, innermost to outermost --------------------
NODE_NVLINK_DOMAIN = "topology.tokenyard.dev/nvlink-domain"
NODE_RACK = "topology.tokenyard.dev/rack"
NODE_ZONE = "topology.kubernetes.io/zone"
NODE_GPU_PRODUCT = "nvidia.com/gpu.product"  # as NVIDIA's GPU feature discovery names it
GPU_RESOURCE = "nvidia.com/gpu"

# Default topology levels of ModelDeployment.spec.placement (name -> node label).
DEFAULT_TOPOLOGY_LEVELS = (
    ("nvlink", NODE_NVLINK_DOMAIN),
    ("rack", NODE_RACK),
    ("zone", NODE_ZONE),
)

# --- environment of every engine container ----------------------------------
ENV_MODEL_DEPLOYMENT = "TOKENYARD_MODEL_DEPLOYMENT"
ENV_SERVED_MODEL_NAME = "TOKENYARD_SERVED_MODEL_NAME"
ENV_REVISION = "TOKENYARD_REVISION"
ENV_GROUP_INDEX = "TOKENYARD_GROUP_INDEX"
ENV_RANK = "TOKENYARD_RANK"
ENV_GROUP_SIZE = "TOKENYARD_GROUP_SIZE"  # pods in the group
ENV_LEADER_ADDRESS = "TOKENYARD_LEADER_ADDRESS"  # DNS name of rank 0 via the group's headless Service
ENV_TENSOR_PARALLEL = "TOKENYARD_TENSOR_PARALLEL_SIZE"
ENV_PIPELINE_PARALLEL = "TOKENYARD_PIPELINE_PARALLEL_SIZE"
ENV_ENGINE_PORT = "TOKENYARD_ENGINE_PORT"

# Container port name of the engine's HTTP API on every engine pod.
ENGINE_PORT_NAME = "http"

# --- the simulator's knobs, read by `tokenyard.sim pods` from the pod's env ---
ENV_SIM_MODEL_PRESET = "TOKENYARD_SIM_MODEL"  # e.g. "llama-3.1-8b"
ENV_SIM_TIME_SCALE = "TOKENYARD_SIM_TIME_SCALE"
ENV_SIM_ERROR_RATE = "TOKENYARD_SIM_ERROR_RATE"
ENV_SIM_LATENCY_MULTIPLIER = "TOKENYARD_SIM_LATENCY_MULTIPLIER"
ENV_SIM_STARTUP_SECONDS = "TOKENYARD_SIM_STARTUP_SECONDS"
ENV_SIM_CRASH_AFTER_REQUESTS = "TOKENYARD_SIM_CRASH_AFTER_REQUESTS"
ENV_SIM_MAX_NUM_SEQS = "TOKENYARD_SIM_MAX_NUM_SEQS"  # vLLM's --max-num-seqs: requests beyond it queue
# /metrics fault: "none" (default), "garbage" (200 with a body that is no exposition format), "error" (500)
ENV_SIM_METRICS_FAULT = "TOKENYARD_SIM_METRICS_FAULT"

# --- annotations on engine pods ------------------------------------------------
# Pods in the pod's group (leader included); a group serves only when that many are Ready.
ANNOTATION_GROUP_SIZE = "tokenyard.dev/group-size"
# The planned node of every rank, comma-separated: a gang recreated after a member died can go back there
# even when the dead member's pod is gone.
ANNOTATION_GROUP_NODES = "tokenyard.dev/group-nodes"
