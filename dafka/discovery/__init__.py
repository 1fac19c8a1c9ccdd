"""How peers find each other: the beacon through the towers, what a peer says of itself (PEER-INFO), and
the survey of a cluster's peers and heads."""
