"""Generated wire-contract code for edgefleet (see protos/generate.py).

Hand-written code imports it one way only::

    from edgefleet.v1 import fleet_pb2 as pb, fleet_pb2_grpc as pb_grpc
"""
