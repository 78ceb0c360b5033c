"""Every Redis key and channel of the service: built here, and taken apart here only.

A family is a prefix (its members are the prefix and a suffix) or a function that
builds one key; a reader that scans a family gets its suffix back through the family's
parser, never by slicing a string itself.
"""

from __future__ import annotations

from kombu.transport.redis import Channel

# Queues of the lanes that Redis carries -------------------------------------------------------

REALTIME_QUEUE = "inferq:queue:realtime"  # + ":" + a name or name@version: its requests
REALTIME_ANY = f"{REALTIME_QUEUE}:any"  # INFERQ_PLACEMENT=on_demand: every request, any worker
JOBS_QUEUE = "inferq:queue:jobs"  # the common list; + ":" + name@version: that version's


def realtime_queue(model: str) -> str:
    """The list that realtime requests for ``model`` (a name or ``name@version``) wait on."""
    return f"{REALTIME_QUEUE}:{model}"


def jobs_queue(model_ref: str) -> str:
    """The list that jobs for ``model_ref`` (``name@version``) wait on."""
    return f"{JOBS_QUEUE}:{model_ref}"


def celery_lists(queue: str) -> list[str]:
    """The lists kombu's Redis transport keeps a Celery queue in, one per priority step:
    the queue's own name for step 0, ``<queue><sep><step>`` for the others (kombu's
    separator and steps, read from kombu)."""
    return [queue if step == 0 else f"{queue}{Channel.sep}{step}"
            for step in Channel.priority_steps]


def queued_model(queue: str | bytes) -> str:
    """The model (a name or ``name@version``) a realtime or jobs queue is for."""
    name = queue.decode() if isinstance(queue, bytes) else queue
    for family in (REALTIME_QUEUE, JOBS_QUEUE):
        if name.startswith(family + ":"):
            return name[len(family) + 1:]
    raise ValueError(f"not a model's queue: {name}")


# Realtime answers and token streams ------------------------------------------------------

CANCEL_CHANNEL = "inferq:cancel"  # pub/sub: request ids whose caller has gone


def reply(request_id: str) -> str:
    """The list a realtime request's whole answer comes back on."""
    return f"inferq:reply:{request_id}"


def stream(request_id: str) -> str:
    """The pub/sub channel a realtime request's token stream comes back on."""
    return f"inferq:stream:{request_id}"


# Realtime requests taken by workers (jobs.realtime.taken) ------------------------------

REALTIME_TAKEN = "inferq:realtime:taken:"  # + a worker's name: what it took, not yet answered
REALTIME_STARTED = "inferq:realtime:started:"  # + a worker's name: ids handed to its engine
REALTIME_LEASE = "inferq:realtime:lease:"  # + a worker's name: present while it lives
REALTIME_TAKERS = "inferq:realtime:takers"  # set: workers that may hold taken requests


def realtime_taken(worker: str) -> str:
    """The list of the requests ``worker`` took from the realtime queues and has not
    answered yet (each entry: the queue it came from and the message as pushed)."""
    return REALTIME_TAKEN + worker


def realtime_started(worker: str) -> str:
    """The set of the ids of ``worker``'s taken requests that went to its engine: those
    are never given to another worker (its answer may have begun)."""
    return REALTIME_STARTED + worker


def realtime_lease(worker: str) -> str:
    """Present (expiring) while ``worker``'s realtime lane lives."""
    return REALTIME_LEASE + worker


# Workers --------------------------------------------------------------------------------------

WORKERS = "inferq:workers:"  # + a worker's name: its heartbeat (JSON), expiring


def worker(name: str) -> str:
    return WORKERS + name


def worker_name(key: str | bytes) -> str:
    k = key.decode() if isinstance(key, bytes) else key
    return k[len(WORKERS):]


# Placement of model versions --------------------------------------------------------------

MODEL_COMMANDS = "inferq:model-commands:"  # + a worker's name: load/unload commands
PLACING = "inferq:placing:"  # + name@version: the worker chosen to load it
MODEL_LOADS = "inferq:model-loads"  # hash: "<ref>|<reason>" -> count
MODEL_LOADS_RECENT = "inferq:model-loads:recent"  # list of JSON records, newest first
LOAD_FAILED = "inferq:load-failed:"  # + name@version: why its last load failed

# Shadow traffic ---------------------------------------------------------------------------

SHADOW_STATS = "inferq:shadow:"  # + name: hash "<version>|<field>" -> number
SHADOW_LATENCIES = "inferq:shadow-latency:"  # + name@version: recent latencies, newest first

# Limits, admission and latency history ----------------------------------------------------

ARRIVALS = "inferq:admission:arrivals:"  # + lane:model, a hash second -> arrivals
INFLIGHT = "inferq:admission:inflight:"  # + lane:model, a sorted set id -> expiry (ms)
STATS = "inferq:stats:"  # + the latency history's series


def rate_limit(tenant_id: str, model: str) -> str:
    """The hash of a project's counters for one model (one hash slot per pair)."""
    return f"inferq:rl:{{{tenant_id}:{model}}}"
