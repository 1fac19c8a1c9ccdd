"""Consumer groups (rfc 14): a member's sans-I/O view of its group, and the I/O that joins a consumer to it."""
