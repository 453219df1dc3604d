"""The responder UI at ``/ui``: server-rendered pages over the same stores, audit and roles as the API."""
