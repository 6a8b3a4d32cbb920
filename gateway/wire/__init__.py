"""Wire formats: pydantic models of what callers send and receive, and the codecs that
convert them to and from the internal decision model. Validation happens here; the
domain receives only valid decisions.
"""
