"""Who is calling: credentials, principals (tenant + scopes) and the tenant store.

API Gateway runs the authorizer (`gateway.functions.authorizer`) before the gateway function; it
verifies the bearer credential and hands the gateway a principal in
`requestContext.authorizer`. The gateway checks each route's scope against it.
"""
