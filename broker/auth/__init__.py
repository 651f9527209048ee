"""The broker's side of authentication and authorization (issue #37): the request-code map, and
the wiring of the shared `auth.Enforcer` into the broker's dispatcher and connections."""
