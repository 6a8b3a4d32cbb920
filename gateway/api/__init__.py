"""The HTTP surface: one Powertools `Router` per resource, each built by a factory that
receives the services it calls (`gateway.api.app` assembles them), plus the paths and the
response and error rendering every route shares."""
