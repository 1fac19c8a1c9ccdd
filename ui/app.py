"""The console's web application (Starlette).

Starlette, served by uvicorn, because it is a small, well-kept ASGI toolkit
with what a console needs and nothing it does not (routing, Jinja2
templates, static files, streaming responses for server-sent events), and it
lets the pages wait on the cluster without holding a thread each.

Every page is rendered on the server from :class:`~.model.ClusterModel` by
Jinja2 with autoescaping on: record values and names are hostile input.  A
strict Content-Security-Policy allows only this origin's own script and
style files; nothing comes from elsewhere.  A page's ``?fragment=1`` is its
content alone, which ``console.js`` fetches every few seconds to keep the
page live.  Producing needs ``--allow-produce`` and the form's token (CSRF).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import secrets
import time
from pathlib import Path
from typing import Any, AsyncIterator
from urllib.parse import parse_qs, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from dafka.records import PartitionKey
from dafka import __version__
from dafka.protocol.commits import OFFSETS_TOPIC, decode_commits
from dafka.mirror.provenance import PROVENANCE_TOPIC, MalformedProvenance, Provenance

from . import values
from .peer import ConsolePeer, Tail

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
PAGE = 50  # records a page of the message browser
MAX_PAGE = 500
SEARCH_LIMIT = 100_000  # records a search looks through at most
SEARCH_CHUNK = 2_000
TAIL_EVENT_GAP = 0.1  # seconds between two events of a live tail at least
COMMITS_READ = 1_000  # newest records of each partition of a group's offsets topic read for its commits
PROVENANCE_READ = 10_000  # newest records of each partition of the provenance topic read (one a partition mirrored)
PROVENANCE_EVERY = 10.0  # seconds the provenance read is kept
MAX_FORM = 1024 * 1024  # bytes of a Produce form
FIRST_ROUND = 1.5  # seconds a page waits for the stores' first answers after the console woke

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-store"}


def _size(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _duration(s: Any) -> str:
    if not isinstance(s, (int, float)) or not math.isfinite(s):
        return "–"
    s = int(s)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _count(n: Any) -> str:
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return "–" if n is None else str(n)
    return f"{n:,}" if isinstance(n, int) else f"{n:,.0f}"


def _stamp(ms: Any) -> str:
    if not isinstance(ms, int):
        return "–"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d} UTC"
    except (OverflowError, OSError, ValueError):  # a stamp no calendar has (a store's, so hostile input)
        return f"{ms} ms"


def _short(address: Any) -> str:
    address = str(address)
    return address[:8] + "…" if len(address) > 12 else address


class Console:
    """The web application around a :class:`ConsolePeer`."""

    def __init__(self, peer: ConsolePeer, *, allow_produce: bool = False) -> None:
        self.peer = peer
        self.allow_produce = allow_produce
        self.token = secrets.token_urlsafe(32)
        self.started = time.time()
        self._producers: dict[str, Any] = {}
        self._provenance_read: tuple[float, dict[PartitionKey, Provenance]] = (float("-inf"), {})
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                                      undefined=jinja2.ChainableUndefined)
        self.env.filters.update(size=_size, duration=_duration, count=_count, stamp=_stamp, short=_short)
        self.env.globals.update(link=self.link, version=__version__, allow_produce=allow_produce)
        self.app = Starlette(routes=[
            Route("/", self.overview),
            Route("/topics", self.topics),
            Route("/topic", self.topic),
            Route("/messages", self.messages),
            Route("/live", self.live),
            Route("/groups", self.groups),
            Route("/group", self.group),
            Route("/connectors", self.connectors),
            Route("/produce", self.produce, methods=["GET", "POST"]),
            Route("/api/rates", self.rates),
            Route("/api/group-lag", self.group_lag),
            Route("/api/tail", self.tail),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ], lifespan=self._lifespan)

    @staticmethod
    def link(path: str, **params: Any) -> str:
        """A shareable URL of a page: ``link("/messages", topic=..., partition=..., offset=...)``."""
        query = {k: v for k, v in params.items() if v is not None and v != ""}
        return path + ("?" + urlencode(query) if query else "")

    async def _look(self) -> None:
        """Mark the console as looked at; just after it woke, give the stores a moment to answer."""
        peer = self.peer
        peer.viewed()
        deadline = time.monotonic() + FIRST_ROUND
        while time.monotonic() < deadline:
            if peer.active and (time.monotonic() - peer.activated_at >= FIRST_ROUND or peer.stores_answered()):
                return
            await asyncio.sleep(0.02)

    def _page(self, request: Request, template: str, title: str, **context: Any) -> HTMLResponse:
        """A whole page, or with ``?fragment=1`` its ``content`` block alone (what console.js refreshes)."""
        page = self.env.get_template(template)
        context.update(title=title, request_path=request.url.path, token=self.token,
                       tower=self.peer.tower_connected, towers=self.peer.towers)
        if request.query_params.get("fragment") == "1":
            body = "".join(page.blocks["content"](page.new_context(context)))
        else:
            body = page.render(context)
        return HTMLResponse(body, headers=HEADERS)

    def _error(self, request: Request, status: int, message: str) -> HTMLResponse:
        response = self._page(request, "error.html", "Error", message=message)
        response.status_code = status
        return response

    # -- pages ---------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        await self._look()
        now = time.monotonic()
        data = self.peer.read(lambda m: m.overview(now))
        return self._page(request, "overview.html", "Overview", o=data)

    async def topics(self, request: Request) -> Response:
        await self._look()
        pattern = request.query_params.get("q", "")
        internal = request.query_params.get("internal") == "1"
        now = time.monotonic()
        rows = self.peer.read(lambda m: m.topics(now, pattern, internal))
        return self._page(request, "topics.html", "Topics", rows=rows, q=pattern, internal=internal)

    async def topic(self, request: Request) -> Response:
        await self._look()
        name = request.query_params.get("name", "")
        now = time.monotonic()
        rows = self.peer.read(lambda m: m.topic(name, now))
        if not rows:
            return self._error(request, 404, f"No partition of topic {name!r} is known to the cluster.")
        stores = self.peer.read(lambda m: m.stores())
        retention = sorted({(s["retention_ms"], s["retention_bytes"]) for s in stores if s["retention_ms"] is not None})
        mirrored = {p: prov for (t, p), prov in (await self._provenance()).items() if t == name}
        return self._page(request, "topic.html", f"Topic {name}", name=name, rows=rows, retention=retention,
                          stores=len(stores), mirrored=mirrored)

    async def _provenance(self) -> dict[PartitionKey, Provenance]:
        """Which partitions of this site a mirror copied in, and from where: the site's provenance topic
        (rfc/mirror.md), read at most every :data:`PROVENANCE_EVERY` seconds."""
        now = time.monotonic()
        if now - self._provenance_read[0] < PROVENANCE_EVERY:
            return self._provenance_read[1]
        found: dict[PartitionKey, Provenance] = {}
        for value in await self._newest_values(PROVENANCE_TOPIC, PROVENANCE_READ):
            try:
                record = Provenance.decode(value)
            except MalformedProvenance:
                continue
            found[(record.topic, record.partition)] = record
        self._provenance_read = (now, found)
        return found

    async def _newest_values(self, topic: str, newest: int) -> list[bytes]:
        """The values of the newest ``newest`` records of each partition of ``topic`` (oldest first in each),
        read from the stores."""
        parts = self.peer.read(lambda m: [(r["partition"], r["tail"] or 0, r["head"]) for r in m.topic(topic)])
        out: list[bytes] = []
        for partition, tail, head in parts:
            at = max(tail, (head or 0) - newest + 1)
            while head is not None and at <= head:
                answer = await self._fetch(topic, partition, at, SEARCH_CHUNK)
                if not answer["records"]:
                    break
                out.extend(record[1] for record in answer["records"])
                at = answer["records"][-1][0] + 1
        return out

    async def messages(self, request: Request) -> Response:
        """The message browser: a page of records of one partition, or a search over a range."""
        await self._look()
        q = request.query_params
        topic, partition = q.get("topic", ""), q.get("partition", "")
        fmt = q.get("format", "auto")
        if fmt not in values.FORMATS:
            return self._error(request, 400, f"format must be one of {', '.join(values.FORMATS)}, not {fmt!r}")
        try:
            count = min(MAX_PAGE, max(1, int(q.get("count", PAGE))))
        except ValueError:
            return self._error(request, 400, f"count must be a number, not {q.get('count')!r}")
        partitions = self.peer.read(lambda m: [r["partition"] for r in m.topic(topic)])
        if not partitions:
            return self._error(request, 404, f"No partition of topic {topic!r} is known to the cluster.")
        if partition not in partitions:
            partition = partitions[0]
        p = self.peer.read(lambda m: m.partition(topic, partition))
        head = p.head if p is not None else None
        tail = (p.tail or 0) if p is not None else 0
        where = q.get("offset", "newest")
        if where == "oldest":
            start = tail
        elif where == "newest":
            start = max(tail, (head if head is not None else -1) - count + 1)
        else:
            try:
                start = int(where)
                if start < 0:
                    raise ValueError
            except ValueError:
                return self._error(request, 400, f"offset must be a number, 'oldest' or 'newest', not {where!r}")
        search = q.get("q", "")
        searched = 0
        until = head
        if q.get("until"):
            try:
                until = min(head if head is not None else -1, int(q["until"]))
            except ValueError:
                return self._error(request, 400, f"until must be an offset, not {q['until']!r}")
        if search:
            found, searched = await self._search(topic, partition, start, until, search.encode(), count)
            answer = {"records": found, "tail": None, "complete": True}
        else:
            answer = await self._fetch(topic, partition, start, count)
        rows = []
        for offset, value, stamp, key in answer["records"]:
            used, text = values.render(value, fmt)
            rows.append({"offset": offset, "size": len(value), "stamp": stamp, "format": used, "text": text,
                         "json": used in ("json", "msgpack"), "key": values.key_text(key)})
        return self._page(request, "messages.html", f"{topic} / {_short(partition)}", topic=topic,
                          partition=partition, partitions=partitions, rows=rows, start=start, count=count,
                          head=head, tail=tail, fmt=fmt, formats=values.FORMATS, where=where, search=search,
                          searched=searched, until=q.get("until", ""), moved=answer.get("tail"),
                          complete=answer.get("complete", True))

    async def _fetch(self, topic: str, partition: str, start: int, count: int, timeout: float = 2.0) -> dict[str, Any]:
        """:meth:`ConsolePeer.fetch`, awaited; never longer than its timeout and a margin (a peer thread that
        ended answers nothing)."""
        return await asyncio.wait_for(asyncio.wrap_future(self.peer.fetch(topic, partition, start, count, timeout)),
                                      timeout + 5.0)

    async def _search(self, topic: str, partition: str, start: int, head: int | None, needle: bytes,
                      limit: int) -> tuple[list[tuple[int, bytes, int | None]], int]:
        found: list[tuple[int, bytes, int | None]] = []
        searched = 0
        at = start
        while head is not None and at <= head and searched < SEARCH_LIMIT and len(found) < limit:
            answer = await self._fetch(topic, partition, at, SEARCH_CHUNK, timeout=5.0)
            records = answer["records"]
            if not records:
                break
            searched += len(records)
            found.extend(r for r in records if values.matches(r[1], needle))
            at = records[-1][0] + 1
        return found[:limit], searched

    async def live(self, request: Request) -> Response:
        await self._look()
        topic = request.query_params.get("topic", "")
        return self._page(request, "live.html", f"Live: {topic}", topic=topic)

    async def groups(self, request: Request) -> Response:
        await self._look()
        rows = self.peer.read(lambda m: m.groups_overview())
        return self._page(request, "groups.html", "Consumer groups", rows=rows)

    async def group(self, request: Request) -> Response:
        await self._look()
        name = request.query_params.get("name", "")
        known = self.peer.read(lambda m: name in m.group_names())
        if not known:
            return self._error(request, 404, f"No consumer group {name!r} is known to the cluster.")
        live = self.peer.read(lambda m: bool(m.groups.get(name) and m.groups[name].members))
        if not live:
            await self._read_commits(name)
        members = self.peer.read(lambda m: [
            {"address": a, "topics": list(msg.subjects),
             "partitions": sum(1 for e in msg.entries if e.state == 0)}
            for a, msg in sorted((m.groups[name].members if name in m.groups else {}).items())])
        rows = self.peer.read(lambda m: m.group_partitions(name))
        kafka = self.peer.read(lambda m: m.kafka_groups().get(name))
        return self._page(request, "group.html", f"Group {name}", name=name, members=members, rows=rows,
                          kafka=kafka)

    async def _read_commits(self, group: str) -> None:
        """A group without live members: its newest commits, read from its offsets topic on the stores.  A
        member's commit record holds its whole view of the group's commits (rfc 14.6): the newest records
        of each partition of the topic are enough."""
        commits: dict[PartitionKey, int] = {}
        for value in await self._newest_values(OFFSETS_TOPIC + group, COMMITS_READ):
            try:
                commits.update(decode_commits(value)[1])
            except ValueError:
                continue
        self.peer.read(lambda m: m.on_commits(group, commits))

    async def connectors(self, request: Request) -> Response:
        await self._look()
        mirrors = self.peer.read(lambda m: m.applications("mirror"))
        cdc = self.peer.read(lambda m: m.applications("cdc"))
        provenance = sorted((await self._provenance()).values(), key=lambda p: (p.topic, p.partition))
        return self._page(request, "connectors.html", "Mirrors and CDC", mirrors=mirrors, cdc=cdc,
                          provenance=provenance)

    async def produce(self, request: Request) -> Response:
        await self._look()
        if not self.allow_produce:
            return self._error(request, 403, "Producing is off: start the console with --allow-produce.")
        result = None
        topic = request.query_params.get("topic", "")
        if request.method == "POST":
            body = await request.body()
            if len(body) > MAX_FORM:
                return self._error(request, 413, f"A record sent from the console is at most {MAX_FORM // 1024} KiB.")
            # the form's own encoding (urlencoded): no multipart parser needed for three text fields
            fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
            form = {k: v[0] for k, v in fields.items()}
            token = str(form.get("token", ""))
            if not hmac.compare_digest(token.encode(), self.token.encode()):
                return self._error(request, 403, "The form's token is missing or wrong (CSRF): reload the page.")
            topic = str(form.get("topic", "")).strip()
            value = str(form.get("value", "")).encode()
            key = str(form.get("key", "")).encode() or None  # an empty field: no key
            if not topic:
                return self._error(request, 400, "A topic is needed.")
            try:
                result = await asyncio.to_thread(self._send, topic, value, key)
            except Exception as exc:  # noqa: BLE001 - shown to the user
                log.warning("console: a record for topic %r was not sent: %s", topic, exc)
                return self._error(request, 400, f"The record was not sent: {exc}")
        return self._page(request, "produce.html", "Produce", topic=topic, result=result)

    def _send(self, topic: str, value: bytes, key: bytes | None) -> dict[str, Any]:
        from dafka import Producer
        producer = self._producers.get(topic)
        if producer is None:
            producer = self._producers[topic] = Producer(topic, self.peer.config)
        metadata = producer.send(value, key=key).get(timeout=10)
        return {"topic": topic, "partition": producer.address, "offset": metadata.offset}

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        for producer in self._producers.values():  # the console's own, for the Produce page
            await asyncio.to_thread(producer.close)
        self._producers.clear()

    # -- data for the pages' scripts ------------------------------------------------

    async def rates(self, request: Request) -> Response:
        self.peer.viewed()
        points = self.peer.read(lambda m: list(m.rates))
        now = time.monotonic()
        return JSONResponse({"points": [[round(t - now, 1), round(r, 1)] for t, r in points]}, headers=HEADERS)

    async def group_lag(self, request: Request) -> Response:
        self.peer.viewed()
        name = request.query_params.get("name", "")
        points = self.peer.read(lambda m: list(m.groups[name].lag) if name in m.groups else [])
        now = time.monotonic()
        return JSONResponse({"points": [[round(t - now, 1), lag] for t, lag in points]}, headers=HEADERS)

    async def tail(self, request: Request) -> Response:
        """Server-sent events: the topic's new records as they come (at most peer.TAIL_RATE a second)."""
        topic = request.query_params.get("topic", "")
        fmt = request.query_params.get("format", "auto")
        if not topic or fmt not in values.FORMATS:
            return JSONResponse({"error": "topic and a known format are needed"}, status_code=400)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[list[tuple[str, int, bytes]], int]] = asyncio.Queue(maxsize=100)

        def deliver(records: list[tuple[str, int, bytes]], skipped: int) -> None:  # the peer's thread
            def put() -> None:
                if not queue.full():
                    queue.put_nowait((records, skipped))
            loop.call_soon_threadsafe(put)

        follower = Tail(topic, deliver)
        self.peer.follow(follower)

        async def events() -> AsyncIterator[bytes]:
            try:
                yield b": following\n\n"
                while True:
                    try:
                        records, skipped = await asyncio.wait_for(queue.get(), 15)
                    except asyncio.TimeoutError:
                        yield b": idle\n\n"  # keeps the connection, and finds a closed one
                        continue
                    while not queue.empty():  # one event for what came meanwhile
                        more, more_skipped = queue.get_nowait()
                        records, skipped = records + more, skipped + more_skipped
                    rows = []
                    for partition, offset, value, key in records:
                        used, text = values.render(value, fmt)
                        rows.append({"partition": partition, "offset": offset, "size": len(value),
                                     "format": used, "text": text[:2000], "key": values.key_text(key)})
                    payload = json.dumps({"records": rows, "skipped": skipped})
                    yield f"data: {payload}\n\n".encode()
                    await asyncio.sleep(TAIL_EVENT_GAP)  # at most 10 events a second, whatever the rate
            finally:
                self.peer.unfollow(follower)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={**HEADERS, "X-Accel-Buffering": "no"})
