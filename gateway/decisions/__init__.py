"""The decision domain: one internal representation for both wire formats, the
arithmetic on probabilities, and the service that asks an endpoint pool.

Nothing here imports Powertools or boto3: adapters are passed in.
"""
