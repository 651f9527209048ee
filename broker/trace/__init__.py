"""Message trace: what the broker did with each message, recorded for every client (issue #42).

`recorder` takes events on the request paths (one bounded deque append each), `segments` keeps them
in append-only files under `<store>/trace/`, `service` moves them from one to the other off the
request paths and applies retention, `query` answers QUERY_MESSAGE_TRACE from them and the store."""
