"""Community fingerprints: a hash of the sorted member ids with their name+description digests
and of the internal relationships (endpoints, weight, type+description digest). Equal
fingerprints mean the report would be written from the same facts, so it is reused."""

from __future__ import annotations

import hashlib

import numpy as np

from services.communities.graph import I64, Graph

_MEMBER = np.dtype([("id", "<i8"), ("digest", "V16")])
_EDGE = np.dtype([("src", "<i8"), ("dst", "<i8"), ("weight", "<f8"), ("digest", "V16")])


class Fingerprinter:
    """Sorts the graph's rows once; each level then only groups them by community."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        members = np.empty(graph.n, dtype=_MEMBER)
        members["id"] = graph.node_ids  # nodes are in id order already
        members["digest"] = graph.node_digests
        self.members = members
        edges = np.empty(len(graph.rel_ids), dtype=_EDGE)
        edges["src"] = graph.node_ids[graph.rel_src]
        edges["dst"] = graph.node_ids[graph.rel_dst]
        edges["weight"] = graph.rel_weight
        edges["digest"] = graph.rel_digests
        order = edge_order(graph.n, graph.rel_src, graph.rel_dst, edges)
        self.edges = edges[order]
        self.edge_src = graph.rel_src[order]
        self.edge_dst = graph.rel_dst[order]

    def level(self, labels: I64, count: int) -> list[str]:
        """One hex fingerprint per community label ``0..count-1`` of one level."""
        members = np.flatnonzero(labels >= 0)
        order = members[np.argsort(labels[members], kind="stable")]
        member_bytes = memoryview(self.members[order].tobytes())
        member_bounds = np.searchsorted(labels[order], np.arange(count + 1))

        src_label, dst_label = labels[self.edge_src], labels[self.edge_dst]
        internal = np.flatnonzero((src_label == dst_label) & (src_label >= 0))
        edge_order = internal[np.argsort(src_label[internal], kind="stable")]
        edge_bytes = memoryview(self.edges[edge_order].tobytes())
        edge_bounds = np.searchsorted(src_label[edge_order], np.arange(count + 1))

        m_size, e_size = _MEMBER.itemsize, _EDGE.itemsize
        out: list[str] = []
        for c in range(count):
            h = hashlib.blake2b(digest_size=16)
            h.update(member_bytes[member_bounds[c] * m_size : member_bounds[c + 1] * m_size])
            h.update(b"|")
            h.update(edge_bytes[edge_bounds[c] * e_size : edge_bounds[c + 1] * e_size])
            out.append(h.hexdigest())
        return out


def edge_order(n: int, src: I64, dst: I64, edges: np.ndarray) -> I64:
    """The order of ``edges`` by (src, dst, weight, digest), ties by position: one int64
    argsort of the endpoint pair (node indices follow id order), then a full lexsort of only
    the rows that share an endpoint pair with another (several types between two entities)."""
    key = src.astype(np.int64) * max(n, 1) + dst
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return order
    tied = np.zeros(len(order), dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    at = np.flatnonzero(tied)
    rows = order[at]
    words = edges["digest"][rows].copy().view("<u8").reshape(-1, 2)
    order[at] = rows[np.lexsort((words[:, 1], words[:, 0], edges["weight"][rows], key[rows]))]
    return order


def level_fingerprints(graph: Graph, labels: I64, count: int) -> list[str]:
    """One hex fingerprint per community label of one level (see ``Fingerprinter``)."""
    return Fingerprinter(graph).level(labels, count)
