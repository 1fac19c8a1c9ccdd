"""The wire: RFC 46's messages and this project's extensions (:mod:`.messages`), their encoding
(:mod:`.encoding`) and decoding (:mod:`.decoding`), XPUB subscriptions (:mod:`.subscriptions`) and the
tower's frames (:mod:`.beacons`); beside them the live batches, bulk answers, record attributes, per-record
packing and the record intake that travel in them or read them.  No sockets here.

``from dafka import protocol as proto`` gives the codec's names in one place (``proto.encode``,
``proto.RecordMsg``, ...)."""

from .messages import (
    ACK, AckMsg, CONSUMER_HELLO, ConsumerHelloMsg, DIRECT_GAP, DIRECT_HEAD, DIRECT_KEYED_RECORDS, DIRECT_PARTITIONS,
    DIRECT_RECORD, DIRECT_RECORDS, DIRECT_TAIL, DirectGapMsg, DirectHeadMsg, DirectKeyedRecordsMsg, DirectPartitionsMsg,
    DirectRecordMsg, DirectRecordsMsg, DirectTailMsg, FETCH, FetchMsg, GET_HEADS, GROUP_MEMBER, GetHeadsMsg, GroupEntry,
    GroupMemberMsg, HEAD, HEADS_AT, HeadMsg, HeadsAtMsg, HeldAt, KEYED_RECORDS, KNOWN, KeyedRecordsMsg, MAX_COUNT,
    MAX_PEER_INFO, MAX_SEQUENCE, MAX_STRING, MESSAGE_IDS, MalformedMessage, Message, NOTHING_HELD, NOT_KNOWN, NO_KEY,
    NO_OFFSET, PEER_INFO, PartitionInfo, PeerInfoMsg, READING, RECORD, RECORDS, RELEASED, RecordMsg, RecordsMsg,
    STORE_HELLO, STORE_MEMBER, StoreHelloMsg, StoreMemberMsg, UNKNOWN_TIME, VERSION, message_name, split_keys,
)
from .encoding import (
    encode, encode_stamps, heads_at_prefix, pack_contents, pack_keys, record_prefix,
)
from .decoding import (
    KEYED_FRAMES, decode,
)
from .subscriptions import (
    Subscription, decode_heads_at_request, decode_subscription, encode_subscription, subscription, subscription_prefix,
)
from .beacons import (
    BEACON, Beacon, PROFILE, REPLAY_END, ROLES, ROLE_CONSUMER, ROLE_GROUP, ROLE_PRODUCER, ROLE_STORE, SCOPE,
    SCOPED_REPLAY_END, SCOPE_UNKNOWN, TowerBeacon, WELCOME, decode_beacon, decode_profile, decode_tower_beacon,
    encode_beacon, encode_profile, encode_tower_beacon, scope_key, scope_needs,
)
from .packing import split_contents

__all__ = [
    "split_contents",
    "ACK", "AckMsg", "BEACON", "Beacon", "CONSUMER_HELLO", "ConsumerHelloMsg", "DIRECT_GAP", "DIRECT_HEAD",
    "DIRECT_KEYED_RECORDS", "DIRECT_PARTITIONS", "DIRECT_RECORD", "DIRECT_RECORDS", "DIRECT_TAIL", "DirectGapMsg",
    "DirectHeadMsg", "DirectKeyedRecordsMsg", "DirectPartitionsMsg", "DirectRecordMsg", "DirectRecordsMsg",
    "DirectTailMsg", "FETCH", "FetchMsg", "GET_HEADS", "GROUP_MEMBER", "GetHeadsMsg", "GroupEntry", "GroupMemberMsg",
    "HEAD", "HEADS_AT", "HeadMsg", "HeadsAtMsg", "HeldAt", "KEYED_FRAMES", "KEYED_RECORDS", "KNOWN", "KeyedRecordsMsg",
    "MAX_COUNT", "MAX_PEER_INFO", "MAX_SEQUENCE", "MAX_STRING", "MESSAGE_IDS", "MalformedMessage", "Message",
    "NOTHING_HELD", "NOT_KNOWN", "NO_KEY", "NO_OFFSET", "PEER_INFO", "PROFILE", "PartitionInfo", "PeerInfoMsg",
    "READING", "RECORD", "RECORDS", "RELEASED", "REPLAY_END", "ROLES", "ROLE_CONSUMER", "ROLE_GROUP", "ROLE_PRODUCER",
    "ROLE_STORE", "RecordMsg", "RecordsMsg", "SCOPE", "SCOPED_REPLAY_END", "SCOPE_UNKNOWN", "STORE_HELLO",
    "STORE_MEMBER", "StoreHelloMsg", "StoreMemberMsg", "Subscription", "TowerBeacon", "UNKNOWN_TIME", "VERSION",
    "WELCOME", "decode", "decode_beacon", "decode_heads_at_request", "decode_profile", "decode_subscription",
    "decode_tower_beacon", "encode", "encode_beacon", "encode_profile", "encode_stamps", "encode_subscription",
    "encode_tower_beacon", "heads_at_prefix", "message_name", "pack_contents", "pack_keys", "record_prefix",
    "scope_key", "scope_needs", "split_keys", "subscription", "subscription_prefix",
]
