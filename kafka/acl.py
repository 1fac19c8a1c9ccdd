"""What each Kafka principal may do on the gateway: a small ACL file, Kafka's model cut to topics and groups.

One rule a line, ``PRINCIPAL OPERATIONS RESOURCE NAME``, ``#`` to the end of a line a comment::

    # principal  operations         resource  name
    alice        read,write,create  topic     orders
    alice        read               group     billing
    bob          read               topic     logs.*     # a prefix (Kafka's PREFIXED pattern)
    *            describe           topic     *          # every principal, every topic

* PRINCIPAL: a SASL user, ``ANONYMOUS`` for a connection without SASL (Kafka's ``User:ANONYMOUS``),
  or ``*`` for any.
* OPERATIONS: ``read``, ``write``, ``create``, ``describe``, ``delete`` or ``all``, comma-separated.
  As in Kafka, read, write and delete imply describe.
* RESOURCE: ``topic`` or ``group``. NAME: a name, a prefix ending in ``*``, or ``*`` for all.

Rules allow; whatever no rule allows is denied (Kafka's ``allow.everyone.if.no.acl.found=false``).
Without an ACL file every principal may do everything.
"""

from __future__ import annotations

from dataclasses import dataclass

READ, WRITE, CREATE, DESCRIBE, DELETE = "read", "write", "create", "describe", "delete"
OPERATIONS = (READ, WRITE, CREATE, DESCRIBE, DELETE)
TOPIC, GROUP = "topic", "group"
RESOURCES = (TOPIC, GROUP)
ANONYMOUS = "ANONYMOUS"
_IMPLY_DESCRIBE = (READ, WRITE, DELETE)


class AclError(ValueError):
    """An ACL file that does not parse: names the file, the line and what is wrong."""


@dataclass(frozen=True)
class Rule:
    principal: str  # "*": any
    operations: frozenset[str]
    resource: str
    name: str  # "*", a prefix ending in "*", or a literal

    def matches(self, principal: str, operation: str, resource: str, name: str) -> bool:
        if resource != self.resource or self.principal not in ("*", principal):
            return False
        if operation not in self.operations and not (operation == DESCRIBE and
                                                     any(o in self.operations for o in _IMPLY_DESCRIBE)):
            return False
        return name.startswith(self.name[:-1]) if self.name.endswith("*") else name == self.name


class Acl:
    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules

    def allows(self, principal: str, operation: str, resource: str, name: str) -> bool:
        return any(rule.matches(principal, operation, resource, name) for rule in self.rules)

    def allows_any(self, principal: str, operation: str, resource: str) -> bool:
        """Whether some rule lets ``principal`` do ``operation`` on some ``resource`` (an idempotent
        producer's id needs write on a topic, as Kafka 2.8 and later ask)."""
        return any(rule.resource == resource and rule.principal in ("*", principal) and operation in rule.operations
                   for rule in self.rules)


def parse_acl(text: str, source: str = "<acl>") -> Acl:
    rules = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}, line {number}"
        if len(words) != 4:
            raise AclError(f"{where}: {line.strip()!r} is not PRINCIPAL OPERATIONS RESOURCE NAME")
        principal, operations, resource, name = words
        chosen = {o.strip().lower() for o in operations.split(",") if o.strip()}
        if "all" in chosen:
            chosen = (chosen - {"all"}) | set(OPERATIONS)
        unknown = sorted(chosen - set(OPERATIONS))
        if unknown or not chosen:
            raise AclError(f"{where}: unknown operation {', '.join(unknown) or operations!r} "
                           f"(one of {', '.join(OPERATIONS)}, all)")
        if resource.lower() not in RESOURCES:
            raise AclError(f"{where}: unknown resource {resource!r} (topic or group)")
        if "*" in name[:-1]:
            raise AclError(f"{where}: {name!r}: '*' only ends a name (a prefix) or stands alone")
        rules.append(Rule(principal, frozenset(chosen), resource.lower(), name))
    return Acl(rules)


def load_acl(path: str) -> Acl:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise AclError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    return parse_acl(text, path)


class Access:
    """One connection's principal against the ACL (None: everything allowed), counting what it denies."""

    def __init__(self, principal: str = ANONYMOUS, acl: Acl | None = None) -> None:
        self.principal = principal
        self.acl = acl
        self.denied = 0

    def allowed(self, operation: str, resource: str, name: str) -> bool:
        """Whether the ACL allows it, without counting a denial (a listing that leaves out what the principal
        may not describe, as Kafka's Metadata and ListGroups do, or a topic it may not auto-create)."""
        return self.acl is None or self.acl.allows(self.principal, operation, resource, name)

    def may(self, operation: str, resource: str, name: str) -> bool:
        """:meth:`allowed`, and a denial counted when not."""
        if self.allowed(operation, resource, name):
            return True
        self.denied += 1
        return False

    def may_any(self, operation: str, resource: str) -> bool:
        if self.acl is None or self.acl.allows_any(self.principal, operation, resource):
            return True
        self.denied += 1
        return False


ALLOW_ALL = Access()

__all__ = ["ALLOW_ALL", "ANONYMOUS", "Access", "Acl", "AclError", "CREATE", "DELETE", "DESCRIBE", "GROUP", "READ",
           "Rule", "TOPIC", "WRITE", "load_acl", "parse_acl"]
