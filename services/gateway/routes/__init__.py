"""The gateway's HTTP routes, one ``APIRouter`` per OpenAPI tag in a module named for the tag; the
helpers they share (bearer tokens, asking the other services) in ``common.py``."""

from . import budgets, nodes, operations, scheduling, workloads

#: in the order their operations appear in the OpenAPI document
ROUTERS = (operations, workloads, scheduling, budgets, nodes)
