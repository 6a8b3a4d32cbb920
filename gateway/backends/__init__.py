"""Inference backends: how the gateway reaches a model endpoint.

`base` holds the small interface the domain sees; `sagemaker` is the one real
implementation (SageMaker's runtime API through botocore's `sagemaker-runtime` client,
pointed at AWS or, with `endpoint_url`, at a local scorer behind devkit's stand-in for
the runtime API).
"""
