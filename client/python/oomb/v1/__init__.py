"""The oomb.v1 API's generated modules, made when the package is built (setup.py):

  rules_pb2, job_spec_pb2, jobs_pb2 (+ .pyi)   messages of proto/oomb/v1/*.proto
  jobs_pb2_grpc                                JobServiceStub
  health_pb2, health_pb2_grpc                  grpc.health.v1 (Debian's grpc-proto health.proto)
"""
