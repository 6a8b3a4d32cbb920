"""Tools that run beside the deployables, never inside them: the local API Gateway runner,
the admin CLI, the calibration tool, and the stand-ins and process helpers that bench/,
evals/, scripts/ and tests/ share.

Neither the Lambda artifact (`gateway`, `systemone`) nor the scorer image holds this
package; it may import both deployables and the contract, and nothing below it imports it
(tests/unit/test_repository_layers.py).
"""
