"""Inference backends: how the gateway reaches a model endpoint.

`base` holds the small interface the domain sees; `sagemaker` is the one real
implementation (SageMaker's runtime API through the gateway's own SigV4 client,
`sagemaker_runtime`, pointed at AWS or, with `endpoint_url`, at a local scorer that
answers `/endpoints/{name}/invocations`).
"""
