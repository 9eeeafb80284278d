"""Hierarchical queues (pure): the tree, its quotas, usage, fair order and victim choice.

Queues form a tree by their path (``org/research/nlp``). Each has a weight, a guaranteed quota, an
optional limit and lending limit per resource (``gpu`` in GPUs, shares counted as fractions; ``cpu``
in milli-CPU; ``memory`` in MiB), a priority among its siblings and optional minimum runtimes. Usage
counts up the tree. A queue's *effective* guarantee is its own or, where larger, the sum of its
children's (a parent of guaranteed children holds at least what they are guaranteed).

Admission order (``order_pending``), numbered criteria:
1. jobs nominated by a preemption already under way (they take what it frees);
2. queues below their guarantee before queues at or above it, at every level of the tree;
3. the higher queue priority among siblings;
4. the lowest weighted dominant share (max over resources of usage / cluster capacity, / weight),
   for a leaf queue counted half-way through its next job (no rounding bias to small or large queues);
5. within a leaf queue: priority, then age (submission time), then job id.
Each pick adds the job's demand to its queues' usage, so the order interleaves queues fairly.

The tree also carries the preemption policy of the whole config: the default minimum runtimes
(``minRuntime: {priority: S, reclaim: S}``), per priority class (``priorityClasses: {online-serving:
{minRuntime: 0}, best-effort: {preemptible: true}}``) and fair sharing (``fairSharing: {enabled,
threshold}``); see docs/scheduling.md for the rules they feed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

Resources = dict[str, float]
ROOT = ""
EPS = 1e-9
RESOURCES = ("gpu", "cpu", "memory")


@dataclass(frozen=True)
class MinRuntime:
    """Seconds a job runs before it may be preempted: for a higher priority class, for another queue's
    reclaim (guarantee, fair share or a pool taking its lent nodes back). None: not set here."""

    priority: float | None = None
    reclaim: float | None = None

    @classmethod
    def parse(cls, raw: object, where: str) -> MinRuntime | None:
        if raw is None:
            return None
        if isinstance(raw, int | float):
            raw = {"priority": raw, "reclaim": raw}
        if not isinstance(raw, Mapping) or set(raw) - {"priority", "reclaim"}:
            raise ValueError(f"{where}: minRuntime is seconds or {{priority: S, reclaim: S}}")
        values = {k: float(v) for k, v in raw.items()}
        if any(v < 0 for v in values.values()):
            raise ValueError(f"{where}: minRuntime must be >= 0")
        return cls(values.get("priority"), values.get("reclaim"))


DEFAULT_PREEMPTION_DELAY_S = 30.0


@dataclass(frozen=True)
class ClassPolicy:
    """Per priority class: ``min_runtime`` caps the victims' priority minimum runtime when a job of
    this class preempts (online-serving: 0, it does not wait for young training to age); a class that
    is not ``preemptible`` is never a victim (and may not borrow beyond its queue's guarantee);
    ``preemption_delay``: how long a job of this class waits (pending since it was last queued) before
    it may preempt at all, so that room freed by jobs ending meanwhile is taken instead (YuniKorn's
    ``preemption.delay``, 30 s by default there too; online-serving: 0)."""

    min_runtime: float | None = None
    preemptible: bool = True
    preemption_delay: float = DEFAULT_PREEMPTION_DELAY_S


DEFAULT_CLASSES: dict[str, ClassPolicy] = {"online-serving": ClassPolicy(min_runtime=0.0, preemption_delay=0.0)}


@dataclass(frozen=True)
class FairSharing:
    """Reclaim of work above its weighted share: a job whose queue's share after admission, plus
    ``threshold`` (hysteresis, in dominant-share units), is still below the victim queue's share after
    the eviction may take that queue's borrowed work."""

    enabled: bool = False  # opt-in, as Kueue's FairSharing (reclaim costs work: every move is a restart)
    threshold: float = 0.05


@dataclass(frozen=True)
class QueueSpec:
    path: str
    weight: float = 1.0
    guarantee: Mapping[str, float] = field(default_factory=dict)
    limit: Mapping[str, float] | None = None
    lending_limit: Mapping[str, float] | None = None  # at most this much of its unused guarantee is lent
    priority: int = 0  # orders sibling queues (higher first, after guarantees)
    min_runtime: MinRuntime | None = None  # for the jobs of this subtree, as victims


def _amounts(raw: object, where: str) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} is a mapping of resource to amount")
    out = {}
    for k, v in raw.items():
        amount = float(v)
        if amount < 0:
            raise ValueError(f"{where} {k}={amount:g} is negative")
        out[str(k)] = amount
    return out


@dataclass
class QueueTree:
    queues: dict[str, QueueSpec]
    min_runtime: MinRuntime = field(default_factory=MinRuntime)
    classes: Mapping[str, ClassPolicy] = field(default_factory=lambda: dict(DEFAULT_CLASSES))
    fair_sharing: FairSharing = field(default_factory=FairSharing)
    config: Mapping[str, object] | None = None  # what it was built from (the decision log keeps it)
    consolidation: bool = False  # move checkpointable jobs so a fragmented-out job fits (tide.core.consolidate)

    @classmethod
    def from_config(cls, config: Mapping[str, object] | None) -> QueueTree:
        """``{"queues": [{"name", "weight", "guarantee", "limit", "lendingLimit", "priority", "minRuntime",
        "children"}], "minRuntime": ..., "priorityClasses": {...}, "fairSharing": {...},
        "consolidation": {"enabled": bool}}``."""
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
                guarantee = _amounts(item.get("guarantee") or {}, f"queue {path}: guarantee")
                raw_limit = item.get("limit")
                limit = _amounts(raw_limit, f"queue {path}: limit") if raw_limit else None
                if limit is not None:
                    for k, v in guarantee.items():
                        if k in limit and v > limit[k]:
                            raise ValueError(f"queue {path}: guarantee {k}={v} above its limit {limit[k]}")
                raw_lending = item.get("lendingLimit")
                lending = _amounts(raw_lending, f"queue {path}: lendingLimit") if raw_lending else None
                queues[path] = QueueSpec(path, weight, guarantee, limit, lending, int(item.get("priority", 0)),  # type: ignore[call-overload]
                                         MinRuntime.parse(item.get("minRuntime"), f"queue {path}"))
                walk(item.get("children") or [], path)  # type: ignore[arg-type]

        raw = config or {}
        walk(raw.get("queues") or [], ROOT)  # type: ignore[arg-type]
        classes = dict(DEFAULT_CLASSES)
        for name, policy in dict(raw.get("priorityClasses") or {}).items():  # type: ignore[call-overload]
            if name not in ("online-serving", "offline-training", "best-effort"):
                raise ValueError(f"priorityClasses: unknown class {name!r}")
            if not isinstance(policy, Mapping) or set(policy) - {"minRuntime", "preemptible", "preemptionDelay"}:
                raise ValueError(f"priorityClasses.{name}: only minRuntime (seconds), preemptible (bool) and "
                                 "preemptionDelay (seconds)")
            known = classes.get(name, ClassPolicy())
            mr = policy.get("minRuntime", known.min_runtime)
            if mr is not None and float(mr) < 0:
                raise ValueError(f"priorityClasses.{name}: minRuntime must be >= 0")
            try:
                delay = float(policy.get("preemptionDelay", known.preemption_delay))
            except (TypeError, ValueError):
                raise ValueError(f"priorityClasses.{name}: preemptionDelay must be seconds (a number)") from None
            if delay < 0:
                raise ValueError(f"priorityClasses.{name}: preemptionDelay must be >= 0")
            classes[name] = ClassPolicy(None if mr is None else float(mr), bool(policy.get("preemptible", True)),
                                        delay)
        fair = dict(raw.get("fairSharing") or {})  # type: ignore[call-overload]
        if set(fair) - {"enabled", "threshold"}:
            raise ValueError("fairSharing: only enabled (bool) and threshold (dominant share, 0..1)")
        fair_sharing = FairSharing(bool(fair.get("enabled", False)), float(fair.get("threshold", 0.05)))
        if not 0 <= fair_sharing.threshold <= 1:
            raise ValueError("fairSharing.threshold must be within 0..1")
        consolidation = dict(raw.get("consolidation") or {})  # type: ignore[call-overload]
        if set(consolidation) - {"enabled"}:
            raise ValueError("consolidation: only enabled (bool)")
        return cls(queues, MinRuntime.parse(raw.get("minRuntime"), "queue config") or MinRuntime(), classes,
                   fair_sharing, config, bool(consolidation.get("enabled", False)))

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

    @cached_property
    def _effective(self) -> dict[str, Resources]:
        out: dict[str, Resources] = {}
        for path in sorted(self.queues, key=lambda p: -p.count("/") if p else 1):  # deepest first, root last
            if not path:
                continue
            own = dict(self.queues[path].guarantee)
            children = [c for c in self.queues if c and self.parent(c) == path]
            for r in RESOURCES:
                total = sum(out.get(c, {}).get(r, 0.0) for c in children)
                if total > own.get(r, 0.0):
                    own[r] = total
            out[path] = {r: v for r, v in own.items() if v > 0}
        return out

    def guarantee(self, path: str) -> Mapping[str, float]:
        """The effective guarantee: its own, or the sum of its children's where that is larger."""
        return self._effective.get(path, {})

    @cached_property
    def has_guarantees(self) -> bool:
        return any(q.guarantee for q in self.queues.values())

    def split(self, a: str, b: str) -> tuple[str, str] | None:
        """The two children of the lowest common ancestor of ``a`` and ``b`` on their paths (the
        siblings whose guarantees and shares decide between them); None if one contains the other."""
        pa, pb = self.ancestors(a)[::-1], self.ancestors(b)[::-1]
        for x, y in zip(pa, pb, strict=False):
            if x != y:
                return x, y
        return None

    def path_between(self, leaf: str, top: str) -> list[str]:
        """``leaf``, its parents, up to and including ``top``."""
        out = []
        for path in self.ancestors(leaf):
            out.append(path)
            if path == top:
                break
        return out

    def victim_min_runtime(self, queue: str, reclaim: bool, default: float) -> float:
        """The minimum runtime that protects a job of ``queue``: set on its nearest ancestor, else the
        tree's, else ``default`` (TIDE_MIN_RUNTIME_S)."""
        for path in self.ancestors(queue):
            mr = self.spec(path).min_runtime
            value = None if mr is None else (mr.reclaim if reclaim else mr.priority)
            if value is not None:
                return value
        value = self.min_runtime.reclaim if reclaim else self.min_runtime.priority
        return default if value is None else value

    def class_policy(self, priority_class: str) -> ClassPolicy:
        return self.classes.get(priority_class, ClassPolicy())


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


def borrowing_share(tree: QueueTree, path: str, usage: Mapping[str, float], capacity: Mapping[str, float]) -> float:
    """What the queue holds beyond its (effective) guarantee, as a dominant share of the cluster, / weight."""
    g = tree.guarantee(path)
    over = {r: max(0.0, usage.get(r, 0.0) - g.get(r, 0.0)) for r in capacity}
    return dominant_share(over, capacity) / tree.spec(path).weight


def below_guarantee(guarantee: Mapping[str, float], usage: Mapping[str, float]) -> bool:
    """True while some guaranteed resource is not yet in use up to its guarantee."""
    return any(usage.get(r, 0.0) + EPS < g for r, g in guarantee.items() if g > 0)


def within_guarantee(guarantee: Mapping[str, float], usage: Mapping[str, float], demand: Mapping[str, float]) -> bool:
    """Does admitting ``demand`` keep the queue within its guarantee in every guaranteed resource the
    demand asks for (and does the guarantee cover at least one of them)? Kueue's reclaim rule."""
    asked = [r for r, g in guarantee.items() if g > 0 and demand.get(r, 0.0) > 0]
    return bool(asked) and all(usage.get(r, 0.0) + demand[r] <= guarantee[r] + EPS for r in asked)


@dataclass(frozen=True)
class Excess:
    """Admitting a job would take ``path`` over its limit in ``resource`` by ``amount``."""

    path: str
    resource: str
    amount: float
    reason: str


def limit_excess(tree: QueueTree, queue: str, demand: Mapping[str, float], usage: Mapping[str, Resources]
                 ) -> list[Excess]:
    """Where admitting ``demand`` takes the queue or an ancestor over its limit (empty: within limits)."""
    out = []
    for path in tree.ancestors(tree.resolve(queue)):
        spec = tree.spec(path)
        if spec.limit is None:
            continue
        have = usage.get(path, {})
        for r, cap in spec.limit.items():
            need = demand.get(r, 0.0)
            if need > 0 and have.get(r, 0.0) + need > cap + EPS:
                out.append(Excess(path, r, have.get(r, 0.0) + need - cap,
                                  f"queue {path} at its limit: {r} {have.get(r, 0.0):g} in use + {need:g} > {cap:g}"))
    return out


def within_limits(tree: QueueTree, queue: str, demand: Mapping[str, float], usage: Mapping[str, Resources]) -> str:
    """'' when admitting ``demand`` keeps the queue and every ancestor within its limit, else why not."""
    excess = limit_excess(tree, queue, demand, usage)
    return excess[0].reason if excess else ""


def unlent_reserve(tree: QueueTree, queue: str, usage: Mapping[str, Resources], resource: str = "gpu") -> float:
    """What other queues keep of their unused guarantee beyond their ``lendingLimit`` (not lendable to
    ``queue``'s subtree): the sum over queues outside the job's path of guarantee - lendingLimit - usage."""
    mine = set(tree.ancestors(tree.resolve(queue)))
    total = 0.0
    for path, spec in tree.queues.items():
        if not path or spec.lending_limit is None or path in mine or resource not in spec.lending_limit:
            continue
        kept = tree.guarantee(path).get(resource, 0.0) - spec.lending_limit[resource]
        total += max(0.0, kept - usage.get(path, {}).get(resource, 0.0))
    return total


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

            def key(c: str) -> tuple[bool, int, float, str]:
                spec, u = tree.spec(c), use.get(c, {})
                # the share half-way through admitting its head job: neither the queue before it (which
                # favours small queues) nor after it (which favours large ones)
                mid = add(u, by_leaf[c][-1].demand, 0.5) if by_leaf.get(c) else u
                return (not below_guarantee(tree.guarantee(c), u), -spec.priority,
                        dominant_share(mid, capacity) / spec.weight, c)

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
    """A preemption candidate. ``borrowed``: GPUs its queue holds beyond what protects it (the same for
    every candidate of the queue; 0 when it runs within its guarantee); ``weight``: its queue's."""

    job_id: str
    queue: str
    priority: int
    gpus: float
    work_lost_s: float
    preemptible: bool = True  # False while it has not yet run its minimum runtime
    borrowed: float = 0.0
    weight: float = 1.0
    extra: bool = False  # an elastic gang's pod beyond minMember: the first to go


class VictimGuard:
    """The queue-level rules a victim set must keep (guarantee protection, fair-share hysteresis,
    limits); the default allows every set. ``admits`` extends the guard's running set by one victim
    when the rules still hold (the sequence the greedy pass tries); ``valid`` checks a whole set."""

    def reset(self) -> None:
        pass

    def admits(self, victim: RunningJob) -> bool:
        return True

    def valid(self, victims: list[RunningJob]) -> bool:
        return True


WORK_LOST_BAND_S = 60.0


def work_lost_band(work_lost_s: float) -> int:
    """Doubling bands of work lost (under 1 min, 1-3 min, 3-7 min, 7-15 min, ...): victims in one band
    cost about the same, so the spread over borrowing queues decides between them; a lower band always
    goes first (spreading the victims never takes a job that loses far more work)."""
    return int(math.log2(1.0 + max(0.0, work_lost_s) / WORK_LOST_BAND_S))


def gpu_time_lost(victim: RunningJob) -> float:
    """GPU-seconds an eviction costs: its GPUs times the work it loses, counted as at least
    ``WORK_LOST_BAND_S`` (a restart is never free)."""
    return victim.gpus * max(victim.work_lost_s, WORK_LOST_BAND_S)


def select_victims(
    candidates: Iterable[RunningJob],
    fits_without: Callable[[list[RunningJob]], bool],
    guard: VictimGuard | None = None,
    monotone: bool = False,
) -> list[RunningJob] | None:
    """The cheapest whole jobs whose eviction lets the preemptor fit, or None.

    The sequence tried: an elastic gang's extra pods first, then jobs of queues borrowing (``borrowed``
    > 0), then lower priority, then the least work lost in doubling bands (``work_lost_band``), then the
    queue borrowing most per weight *after the victims already taken* (so victims spread over the
    borrowing queues instead of all coming from one, but never at the price of a victim that loses
    more than twice the work of another), then least work lost. A victim the ``guard`` refuses is
    skipped. Greedy until it fits, then every victim that is not needed is dropped again (last chosen
    first), then a victim is swapped for a smaller one of no better rank while the preemptor still
    fits and the swap loses no more GPU-time (``gpu_time_lost``), so GPUs evicted / needed stays close
    to 1 without trading a young job for one that has run long.

    ``monotone``: the caller knows that evicting more never stops the preemptor from fitting (a set
    fits, so does every larger one). The whole sequence is tried first (it does not fit: no victims),
    then a bisection finds the shortest prefix that fits, the one the greedy pass stops at.
    """
    guard = guard or VictimGuard()
    guard.reset()
    pool = [c for c in candidates if c.preemptible]
    by_queue: dict[str, list[RunningJob]] = {}
    for c in sorted(pool, key=lambda c: (not c.extra, c.priority, c.work_lost_s, c.gpus, c.job_id)):
        by_queue.setdefault(c.queue, []).append(c)
    left = {q: jobs[0].borrowed for q, jobs in by_queue.items()}
    heads = {q: 0 for q in by_queue}

    def rank(c: RunningJob, borrowed: float) -> tuple[bool, bool, int, int, float, float, float, str]:
        return (not c.extra, borrowed <= EPS, c.priority, work_lost_band(c.work_lost_s), -borrowed / c.weight,
                c.work_lost_s, c.gpus, c.job_id)

    sequence: list[RunningJob] = []
    while True:
        best: RunningJob | None = None
        for q, i in heads.items():
            if i < len(by_queue[q]) and (best is None or rank(by_queue[q][i], left[q]) < rank(best, left[best.queue])):
                best = by_queue[q][i]
        if best is None:
            break
        heads[best.queue] += 1
        if guard.admits(best):
            sequence.append(best)
            left[best.queue] -= best.gpus
    if monotone:
        known: dict[tuple[str, ...], bool] = {}
        fits_without = _tried_once(fits_without, known)
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
    else:
        chosen = []
        for c in sequence:
            if fits_without(chosen):
                break
            chosen.append(c)
        if not fits_without(chosen):
            return None
    for victim in reversed(list(chosen)):
        trial = [v for v in chosen if v is not victim]
        if fits_without(trial):
            chosen = trial
    # evict no more than needed: swap a victim for a smaller one of no better rank when that still fits
    # and loses no more GPU-time
    def tier(c: RunningJob) -> tuple[bool, bool, int]:
        return (not c.extra, c.borrowed <= EPS, c.priority)

    improved = True
    while improved:
        improved = False
        for victim in list(chosen):
            for c in sequence:
                if (c in chosen or c.gpus >= victim.gpus or tier(c) > tier(victim)
                        or gpu_time_lost(c) > gpu_time_lost(victim)):
                    continue
                trial = [c if v is victim else v for v in chosen]
                if guard.valid(trial) and fits_without(trial):
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
