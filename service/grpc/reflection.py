"""Server reflection over every served service, whichever descriptor pool defines it.

attnserve.v1 and health live in protobuf's default pool, the Open Inference Protocol in a
pool of its own (protos/generate.py says why); grpc-reflection answers from one pool, so
it gets a pool holding all of their files.
"""

from __future__ import annotations

import grpc
from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha import reflection, reflection_pb2


def enable_reflection(server: grpc.aio.Server, services: list[ServiceDescriptor]) -> None:
    """Reflection for `services` and for itself."""
    pool = DescriptorPool()
    added: set[str] = set()

    def add(file: FileDescriptor) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:  # a pool takes a file after its imports
            add(dependency)
        pool.AddSerializedFile(file.serialized_pb)
        added.add(file.name)

    for file in [s.file for s in services] + [reflection_pb2.DESCRIPTOR]:
        add(file)
    names = [s.full_name for s in services] + [reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server, pool=pool)
