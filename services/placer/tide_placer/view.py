"""The placer's cached view of the cluster: registered nodes minus claims, and the jobs it plans with.

Redis stays the authority. Each cycle the view diffs the claim index against what it has applied
(new claims are allocated, gone ones released) instead of rebuilding everything, and it rebuilds from
scratch every ``resync_s``, when a node (re-)registers (``keys.NODES_VERSION``), or when told it is
stale (a reservation it thought would fit was refused by Redis). A stale view can only cost a refused
reservation, never a double allocation: the claim script checks every slot.

It also keeps the job records it plans with (pending jobs and jobs holding claims), as the JSON last
read or written with the parsed record, so that a backlog of pending jobs is not read and parsed again
every cycle. A kept record is read again after ``resync_s``; every write compares against what Redis
holds (``JobStore.change``), so an out-of-date copy can cost a planning mistake that Redis refuses,
never a lost change.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis
from tide.core import Allocation, Cluster, OversubscriptionError
from tide.core.cycle_context import Running
from tide.core.running_tally import RunningTally
from tide.runtime import freeze_long_lived
from tide.schemas.events import JobRecord
from tide.schemas.node import NodeDescription
from tide.store import keys
from tide.store.claims import ClaimStore

log = structlog.get_logger()


@dataclass(frozen=True)
class Known:
    raw: str  # the JSON as stored in Redis
    record: JobRecord  # parsed from ``raw``; never changed in place
    read_at: float  # monotonic


def usable_node(node_id: str, raw: str) -> NodeDescription | None:
    """The stored description, or None (logged) when it does not parse or the core cannot build it."""
    try:
        node = NodeDescription.model_validate_json(raw)
        Cluster.from_descriptions([node])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        log.warning("node_description_refused", node_id=node_id, error=str(exc))
        return None
    return node


class ClusterView:
    def __init__(self, redis: Redis, claims: ClaimStore, resync_s: float) -> None:
        self.redis = redis
        self.claims = claims
        self.resync_s = resync_s
        self.nodes: list[NodeDescription] = []
        self.by_id: dict[str, NodeDescription] = {}
        self.cluster = Cluster.from_descriptions([])
        self._empty: Cluster | None = None  # ``cluster`` without claims, for the nodes version last read
        self.allocs: dict[str, Allocation] = {}  # claim key -> allocation applied to ``cluster``
        self._owner: dict[str, tuple[str, str]] = {}  # claim key of ``allocs`` -> (job, pod), parsed once
        # claims this placer took since the last refresh, with their allocations (``note_claims``)
        self._noted: dict[str, Allocation] = {}
        self.known: dict[str, Known] = {}  # job id -> its record as last read or written
        self.tally = RunningTally()  # the running jobs counted (queue usage, priorities, elastic jobs)
        self._by_job: dict[str, list[Allocation]] = {}  # ``allocs`` grouped by job (kept as claims come and go)
        # the jobs holding claims with their records, as the last refresh handed them out: kept across cycles,
        # changed for the jobs whose claims or record changed since (``_changed``), built anew after a rebuild
        self._run: Running = {}
        self._changed: set[str] = set()
        self._run_whole = True
        self._none_stale_until = 0.0  # monotonic: no kept record is older than ``resync_s`` before then
        self._node_raw: dict[str, tuple[str, NodeDescription | None]] = {}
        self._nodes_version: str | None = None  # keys.NODES_VERSION when the nodes were last read
        self._frozen_version: str | None = None  # the nodes version whose descriptions were left out of the GC
        self._built = 0.0
        self._stale = True

    def invalidate(self) -> None:
        self._stale = True
        self._noted = {}  # a view rebuilt from Redis reads every claim (e.g. after another placer led)

    def note_claims(self, allocs: dict[str, Allocation]) -> None:
        """Claims this placer just took (a cycle's reservations), with their allocations: the next refresh that
        finds them in the claim index applies them from here instead of reading each one back. Notes that
        refresh does not use (a claim released before it read the index) are dropped with it."""
        self._noted.update(allocs)

    # ------------------------------------------------------------ job records
    def kept(self, job_id: str) -> Known | None:
        """The job's record as last read or written, with its JSON."""
        return self.known.get(job_id)

    def remember(self, record: JobRecord, raw: str) -> None:
        """Keep a record this placer just wrote (saves reading it back)."""
        self._keep(Known(raw, record, time.monotonic()))

    def _keep(self, known: Known) -> None:
        self.known[known.record.job_id] = known
        self._changed.add(known.record.job_id)

    def _drop(self, job_id: str) -> None:
        self.known.pop(job_id, None)
        self._changed.add(job_id)

    def record(self, job_id: str) -> JobRecord | None:
        known = self.known.get(job_id)
        return known.record if known is not None else None

    async def records(self, job_ids: list[str], fresh: bool = False) -> list[JobRecord | None]:
        """The records of ``job_ids``: kept ones unless older than ``resync_s`` (or ``fresh``), the others
        read in one call."""
        now = time.monotonic()
        if fresh:
            stale = list(job_ids)
        elif now < self._none_stale_until:  # every kept record is younger than resync_s: only the unknown ones
            known = self.known
            stale = [j for j in job_ids if j not in known]
        else:
            stale = [j for j in job_ids if (k := self.known.get(j)) is None or now - k.read_at >= self.resync_s]
            self._none_stale_until = -1.0  # found again below, once these are read
        if stale:
            for job_id, raw in zip(stale, await self.redis.mget([keys.job(j) for j in stale]), strict=True):
                if raw:
                    self._keep(Known(raw, JobRecord.model_validate_json(raw), now))
                else:
                    self._drop(job_id)
        if self._none_stale_until < 0:
            # every record kept now, and any kept later (read later), is fresh until the oldest turns stale
            self._none_stale_until = min((k.read_at for k in self.known.values()), default=now) + self.resync_s
        return [k.record if (k := self.known.get(j)) is not None else None for j in job_ids]

    def forget_except(self, job_ids: set[str]) -> None:
        """Drop kept records of jobs neither pending nor holding claims (a bounded cache)."""
        for job_id in [j for j in self.known if j not in job_ids]:
            self._drop(job_id)

    # ------------------------------------------------------------ the cluster
    async def refresh(self, pending_ids: list[str], read: tuple[str | None, set[str]] | None = None
                      ) -> tuple[list[NodeDescription], Cluster, Running]:
        """The view brought up to date; ``read``: the nodes' version and the claim index as the caller just read
        them (saves a round trip), else read here."""
        if read is None:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.get(keys.NODES_VERSION)
                pipe.smembers(keys.CLAIMS_INDEX)
                version, members = await pipe.execute()
            read = (version, set(members))
        version, claim_keys = read
        if self.rebuild_due(version):
            nodes_held_still = version == self._nodes_version  # for a whole resync period
            self._nodes_version = version
            await self._rebuild(claim_keys, read_nodes=self._stale or not nodes_held_still)
            if nodes_held_still and version != self._frozen_version:
                # The node descriptions (1,000 nodes: ~110,000 objects) live until the next registration: left
                # out of the garbage collector's full passes, which walked them all every few seconds.
                freeze_long_lived()
                self._frozen_version = version
        else:
            await self._apply_diff(claim_keys)
        self._noted = {}
        running, changed = await self._running()
        self.tally.sync(running, changed)
        if len(self.known) > len(pending_ids) + len(running):  # then some kept record is of neither
            self.forget_except(set(pending_ids) | set(running))
        return self.nodes, self.cluster, running

    def rebuild_due(self, nodes_version: str | None) -> bool:
        """The next ``refresh`` rebuilds the cluster from scratch: never built, told it is stale, a node
        (re-)registered, or ``resync_s`` passed since the last build."""
        return (self._stale or nodes_version != self._nodes_version
                or time.monotonic() - self._built >= self.resync_s)

    async def _read_nodes(self) -> list[NodeDescription]:
        """Every registered node; a description is parsed again only when its stored JSON changed. One the
        planner cannot build (e.g. a MIG instance its GPU model has no profile for) is left out, so that one
        agent's bad registration cannot fail every cycle."""
        out, parsed = [], {}
        for node_id, raw in (await self.claims.node_raws()).items():
            cached = self._node_raw.get(node_id)
            node = cached[1] if cached is not None and cached[0] == raw else usable_node(node_id, raw)
            parsed[node_id] = (raw, node)
            if node is not None:
                out.append(node)
        self._node_raw = parsed
        return out

    async def _rebuild(self, claim_keys: set[str], read_nodes: bool = True) -> None:
        """The cluster from scratch: every claim applied again to the registered nodes. ``read_nodes=False``
        (a periodic resync with the nodes version unchanged: descriptions are written only with a new version)
        starts from the empty cluster of the descriptions already read instead of reading and building them
        again (1,000 nodes: ~40 ms of the event loop every resync)."""
        if read_nodes or self._empty is None:
            self.nodes = await self._read_nodes()
            self.by_id = {n.node_id: n for n in self.nodes}
            self._empty = Cluster.from_descriptions(self.nodes)
        self.cluster = self._empty.copy()
        self.allocs = {}
        self._owner = {}
        self._by_job = {}
        self._run_whole = True
        await self._add(sorted(claim_keys))
        self._built, self._stale = time.monotonic(), False

    async def _apply_diff(self, claim_keys: set[str]) -> None:
        for key in self.allocs.keys() - claim_keys:
            job_id = self.owner(key)[0]
            alloc = self.allocs.pop(key)
            self._owner.pop(key, None)
            held = self._by_job[job_id]
            held.remove(alloc)
            if not held:
                del self._by_job[job_id]
            self._changed.add(job_id)
            try:
                self.cluster.release(alloc)
            except OversubscriptionError:
                self._stale = True
        await self._add(sorted(claim_keys - self.allocs.keys()))
        if self._stale:
            await self._rebuild(claim_keys)

    async def _add(self, claim_keys: list[str]) -> None:
        """Apply claims new to the view: those this placer noted as it took them, the others read."""
        if not claim_keys:
            return
        unknown = [key for key in claim_keys if key not in self._noted]
        read: dict[str, Allocation] = {}
        if unknown:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in unknown:
                    pipe.hget(key, "alloc")
                raws = await pipe.execute()
            read = {key: Allocation.from_dict(json.loads(raw)) for key, raw in zip(unknown, raws, strict=True) if raw}
        for key in claim_keys:
            alloc = self._noted[key] if key in self._noted else read.get(key)
            if alloc is None:
                continue  # released meanwhile
            try:
                self.cluster.allocate(alloc)
            except (OversubscriptionError, KeyError) as exc:
                log.warning("claim_replay_failed", claim=key, error=str(exc))
                continue
            self.allocs[key] = alloc
            job_id = self.owner(key)[0]
            self._by_job.setdefault(job_id, []).append(alloc)
            self._changed.add(job_id)

    def owner(self, key: str) -> tuple[str, str]:
        """(job, pod) of a claim key of ``allocs`` (parsed once while it is held)."""
        found = self._owner.get(key)
        if found is None:
            found = self._owner[key] = keys.parse_claim(key)
        return found

    def extra_allocs(self, elastic: Running) -> dict[str, dict[int, Allocation]]:
        """job -> pod index -> allocation of each elastic extra pod (index >= minMember) holding a claim
        (``elastic``: the running elastic jobs, as ``ClusterView.elastic`` finds them)."""
        out: dict[str, dict[int, Allocation]] = {}
        if not elastic:
            return out
        for key, alloc in self.allocs.items():
            job_id, pod = self.owner(key)
            held = elastic.get(job_id)
            index = pod.rpartition("-")[2]
            if held is None or not index.isdigit():
                continue
            if int(index) >= held[0].spec.spec.gang_size:
                out.setdefault(job_id, {})[int(index)] = alloc
        return out

    def elastic(self, running: Running) -> Running:
        """The elastic jobs among ``running`` (found through the tally, not a scan of every job)."""
        return {job_id: running[job_id] for job_id in self.tally.elastic if job_id in running}

    async def _running(self) -> tuple[Running, set[str] | None]:
        """Every job holding claims, with its record and allocations, in a map of the cycle's own (the lists in it
        are shared between cycles: the planner never changes them, it replaces a job's entry); and the jobs whose
        entry changed since the last call (None: any may have). Only those entries are made again: at a steady
        load a cycle sees a few of hundreds change."""
        by_job = self._by_job
        if not time.monotonic() < self._none_stale_until:  # a kept record may be due to be read again
            await self.records(list(by_job))
        else:  # only the records of jobs with new claims may be missing
            await self.records([j for j in self._changed if j in by_job and j not in self.known])
        known = self.known
        changed: set[str] | None
        if self._run_whole:
            self._run = {j: (k.record, list(allocs)) for j, allocs in by_job.items() if (k := known.get(j)) is not None}
            changed, self._run_whole = None, False
        else:
            changed = self._changed
            for job_id in changed:
                allocs, k = by_job.get(job_id), known.get(job_id)
                if allocs and k is not None:
                    self._run[job_id] = (k.record, list(allocs))
                else:
                    self._run.pop(job_id, None)
        self._changed = set()
        return dict(self._run), changed
