"""Hierarchical queues, weighted dominant-resource fair share, quotas and preemption victims (pure).

Queues form a tree by their path (``org/research/nlp``). Each has a weight, a guaranteed quota and
an optional limit per resource (``gpu`` in GPUs, shares counted as fractions; ``gpu/<model>`` for one
model; ``cpu`` in milli-CPU; ``memory`` in MiB). Usage counts up the tree.

Admission order (``order_pending``), numbered criteria:
1. jobs nominated by a preemption already under way (they take what it frees);
2. queues below their guarantee before queues at or above it, at every level of the tree;
3. the lowest weighted dominant share (max over resources of usage / cluster capacity, / weight),
   for a leaf queue counted half-way through its next job (no rounding bias to small or large queues);
4. within a leaf queue: priority, then age (submission time), then job id.
Each pick adds the job's demand to its queues' usage, so the order interleaves queues fairly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

Resources = dict[str, float]
ROOT = ""
EPS = 1e-9


@dataclass(frozen=True)
class QueueSpec:
    path: str
    weight: float = 1.0
    guarantee: Mapping[str, float] = field(default_factory=dict)
    limit: Mapping[str, float] | None = None


@dataclass
class QueueTree:
    queues: dict[str, QueueSpec]

    @classmethod
    def from_config(cls, config: Mapping[str, object] | None) -> QueueTree:
        """``{"queues": [{"name": "org", "weight": 1, "guarantee": {...}, "limit": {...}, "children": [...]}]}``."""
        queues: dict[str, QueueSpec] = {ROOT: QueueSpec(ROOT)}
        if config is not None and not isinstance(config, Mapping):
            raise ValueError("a queue config is a mapping with 'queues' (and optional 'tides')")

        def walk(items: Iterable[Mapping[str, object]], parent: str) -> None:
            for item in items:
                name = str(item["name"])
                if "/" in name or not name:
                    raise ValueError(f"queue name {name!r} must be one path segment")
                path = f"{parent}/{name}" if parent else name
                weight = float(item.get("weight", 1.0))  # type: ignore[arg-type]
                if weight <= 0:
                    raise ValueError(f"queue {path}: weight must be > 0")
                guarantee = {str(k): float(v) for k, v in dict(item.get("guarantee") or {}).items()}  # type: ignore[call-overload]
                raw_limit = item.get("limit")
                limit = {str(k): float(v) for k, v in dict(raw_limit).items()} if raw_limit else None  # type: ignore[call-overload]
                if limit is not None:
                    for k, v in guarantee.items():
                        if k in limit and v > limit[k]:
                            raise ValueError(f"queue {path}: guarantee {k}={v} above its limit {limit[k]}")
                queues[path] = QueueSpec(path, weight, guarantee, limit)
                walk(item.get("children") or [], path)  # type: ignore[arg-type]

        walk((config or {}).get("queues") or [], ROOT)  # type: ignore[arg-type]
        return cls(queues)

    def resolve(self, queue: str) -> str:
        """The configured queue a job's queue name maps to: itself, else its nearest configured ancestor."""
        path = queue
        while path and path not in self.queues:
            path = path.rpartition("/")[0]
        return path if path else (queue if queue in self.queues else queue)

    def spec(self, path: str) -> QueueSpec:
        return self.queues.get(path) or QueueSpec(path)

    def ancestors(self, path: str) -> list[str]:
        """The path, its parents, up to (not including) the root."""
        out = []
        while path:
            out.append(path)
            path = path.rpartition("/")[0]
        return out

    def parent(self, path: str) -> str:
        return path.rpartition("/")[0]


def add(a: Resources, b: Mapping[str, float], sign: float = 1.0) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + sign * v
    return out


def usage_tree(tree: QueueTree, running: Iterable[tuple[str, Mapping[str, float]]]) -> dict[str, Resources]:
    """Usage per queue path, every job counted in its queue and all its ancestors."""
    usage: dict[str, Resources] = {}
    for queue, demand in running:
        for path in tree.ancestors(tree.resolve(queue)):
            usage[path] = add(usage.get(path, {}), demand)
    return usage


def dominant_share(usage: Mapping[str, float], capacity: Mapping[str, float]) -> float:
    return max((usage.get(r, 0.0) / c for r, c in capacity.items() if c > 0), default=0.0)


def below_guarantee(spec: QueueSpec, usage: Mapping[str, float]) -> bool:
    """True while some guaranteed resource is not yet in use up to its guarantee."""
    return any(usage.get(r, 0.0) + EPS < g for r, g in spec.guarantee.items() if g > 0)


def over_guarantee(spec: QueueSpec, usage: Mapping[str, float], resource: str = "gpu") -> float:
    """How much of ``resource`` the queue uses beyond its guarantee (it is borrowing that much)."""
    return max(0.0, usage.get(resource, 0.0) - spec.guarantee.get(resource, 0.0))


def within_limits(tree: QueueTree, queue: str, demand: Mapping[str, float], usage: Mapping[str, Resources]) -> str:
    """'' when admitting ``demand`` keeps the queue and every ancestor within its limit, else why not."""
    for path in tree.ancestors(tree.resolve(queue)):
        spec = tree.spec(path)
        if spec.limit is None:
            continue
        have = usage.get(path, {})
        for r, cap in spec.limit.items():
            if have.get(r, 0.0) + demand.get(r, 0.0) > cap + EPS:
                return f"queue {path} at its limit: {r} {have.get(r, 0.0):g} in use + {demand.get(r, 0.0):g} > {cap:g}"
    return ""


@dataclass(frozen=True)
class PendingJob:
    job_id: str
    queue: str
    priority: int
    submitted_at: float
    demand: Mapping[str, float]
    nominated: bool = False


def order_pending(
    tree: QueueTree,
    pending: Iterable[PendingJob],
    usage: Mapping[str, Resources],
    capacity: Mapping[str, float],
) -> list[PendingJob]:
    """The admission order (see the module docstring)."""
    jobs = list(pending)
    nominated = sorted((j for j in jobs if j.nominated), key=lambda j: (-j.priority, j.submitted_at, j.job_id))
    by_leaf: dict[str, list[PendingJob]] = {}
    for j in jobs:
        if not j.nominated:
            by_leaf.setdefault(tree.resolve(j.queue), []).append(j)
    for leaf_jobs in by_leaf.values():
        leaf_jobs.sort(key=lambda j: (-j.priority, j.submitted_at, j.job_id), reverse=True)  # pop() = best
    children: dict[str, set[str]] = {}
    for leaf in by_leaf:
        for path in tree.ancestors(leaf):
            children.setdefault(tree.parent(path), set()).add(path)
    use = {k: dict(v) for k, v in usage.items()}
    order = list(nominated)
    while any(by_leaf.values()):
        node = ROOT
        while node not in by_leaf or not by_leaf[node]:
            live = [c for c in children.get(node, ()) if _has_pending(c, by_leaf, children)]
            if not live:
                break

            def key(c: str) -> tuple[bool, float, str]:
                spec, u = tree.spec(c), use.get(c, {})
                # the share half-way through admitting its head job: neither the queue before it (which
                # favours small queues) nor after it (which favours large ones)
                mid = add(u, by_leaf[c][-1].demand, 0.5) if by_leaf.get(c) else u
                return (not below_guarantee(spec, u), dominant_share(mid, capacity) / spec.weight, c)

            node = min(live, key=key)
        job = by_leaf[node].pop()
        order.append(job)
        for path in tree.ancestors(node):
            use[path] = add(use.get(path, {}), job.demand)
    return order


def _has_pending(path: str, by_leaf: dict[str, list[PendingJob]], children: dict[str, set[str]]) -> bool:
    if by_leaf.get(path):
        return True
    return any(_has_pending(c, by_leaf, children) for c in children.get(path, ()))


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    queue: str
    priority: int
    gpus: float
    work_lost_s: float
    preemptible: bool = True  # False while it has not yet run its minimum runtime


def select_victims(
    candidates: Iterable[RunningJob],
    fits_without: Callable[[list[RunningJob]], bool],
    borrowed: Mapping[str, float] | None = None,
    protect_guarantee: bool = False,
    monotone: bool = False,
) -> list[RunningJob] | None:
    """The cheapest whole jobs whose eviction lets the preemptor fit, or None.

    Order of preference: jobs of queues borrowing beyond their guarantee (``borrowed`` gives how much
    each queue borrows), then lower priority, then least work lost. With ``protect_guarantee`` (a
    reclaim) no queue is taken below its guarantee. Greedy until it fits, then every victim that is
    not needed is dropped again (last chosen first), then a victim is swapped for a smaller one of
    no better rank while the preemptor still fits, so GPUs evicted / needed stays close to 1.

    ``monotone``: the caller knows that evicting more never stops the preemptor from fitting (a set
    fits, so does every larger one). The greedy pass only ever tries prefixes of one sequence, so the
    same victims are found with fewer what-ifs: the whole sequence first (it does not fit: no victims),
    then a bisection for the shortest prefix that fits, the one the greedy pass stops at.
    """
    borrowed = dict(borrowed or {})

    def rank(c: RunningJob) -> tuple[bool, int]:
        return (borrowed.get(c.queue, 0.0) <= EPS, c.priority)

    pool = sorted(
        (c for c in candidates if c.preemptible),
        key=lambda c: (*rank(c), c.work_lost_s, c.gpus, c.job_id),
    )
    chosen: list[RunningJob] = []
    left = dict(borrowed)
    known: dict[tuple[str, ...], bool] = {}
    if monotone:
        fits_without = _tried_once(fits_without, known)
        sequence: list[RunningJob] = []
        for c in pool:
            if protect_guarantee and left.get(c.queue, 0.0) + EPS < c.gpus:
                continue  # taking it would push its queue below its guarantee
            sequence.append(c)
            if c.queue in left:
                left[c.queue] -= c.gpus
        if not fits_without(sequence):
            return None
        lo, hi = 0, len(sequence)  # the shortest fitting prefix is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if fits_without(sequence[:mid]):
                hi = mid
            else:
                lo = mid + 1
        chosen = sequence[:lo]
        if lo:
            known[tuple(v.job_id for v in sequence[:lo - 1])] = False  # shorter than the shortest that fits
        left = dict(borrowed)
        for c in chosen:
            if c.queue in left:
                left[c.queue] -= c.gpus
    else:
        for c in pool:
            if fits_without(chosen):
                break
            if protect_guarantee and left.get(c.queue, 0.0) + EPS < c.gpus:
                continue  # taking it would push its queue below its guarantee
            chosen.append(c)
            if c.queue in left:
                left[c.queue] -= c.gpus
        if not fits_without(chosen):
            return None
    for victim in reversed(list(chosen)):
        trial = [v for v in chosen if v is not victim]
        if fits_without(trial):
            chosen = trial
    # evict no more than needed: swap a victim for a smaller one of no better rank when that still fits
    improved = True
    while improved:
        improved = False
        for victim in list(chosen):
            for c in pool:
                if c in chosen or c.gpus >= victim.gpus or rank(c) > rank(victim):
                    continue
                if protect_guarantee and left.get(c.queue, 0.0) + (victim.gpus if victim.queue == c.queue else 0) \
                        + EPS < c.gpus:
                    continue
                trial = [c if v is victim else v for v in chosen]
                if fits_without(trial):
                    if victim.queue in left:
                        left[victim.queue] += victim.gpus
                    if c.queue in left:
                        left[c.queue] -= c.gpus
                    chosen, improved = trial, True
                    break
            if improved:
                break
    return chosen


def _tried_once(
    fits_without: Callable[[list[RunningJob]], bool], known: dict[tuple[str, ...], bool]
) -> Callable[[list[RunningJob]], bool]:
    """``fits_without`` that evaluates each victim list once (``known`` holds the answers)."""

    def fits(victims: list[RunningJob]) -> bool:
        key = tuple(v.job_id for v in victims)
        if key not in known:
            known[key] = fits_without(victims)
        return known[key]

    return fits
