"""A small synthetic corpus with known answers to graph questions (issue 33).

    .venv/bin/python bench/graph_corpus.py --out bench/graph_corpus [--seed 7]

writes events.jsonl (document events, schema_version 2), questions.jsonl and README.md, byte
for byte the same for a seed. Standard library only; the world and every answer come from one
random.Random(seed), and nothing below is written by hand but the word lists.

World: 24 invented companies in four supply tiers, raw materials and components (role vendor),
assemblies and finished goods (role manufacturer); each in one region (APAC, EMEA, Americas;
its headquarters city is wording, not a fact) with one product. A buyer of tier t buys from 1-3
companies of tier t-1 (a DAG three hops deep; everyone below the top tier has a buyer). 16
contracts ("Contract NC-2024-017", the customer's initials) each between a vendor and a
manufacturer (half of them on a supply link), approved by 1-2 of 9 invented people. Facts,
(kind, a, b), are the unit of everything below: ROLE (company, vendor|manufacturer), LOCATED_IN
(company, region), SUPPLIES (supplier, buyer), PARTY_TO (company, contract), APPROVED (person,
contract). Entity types are the extractor's (schemas/document_event.v2.json): companies ORG,
people PERSON, regions LOC (APAC and EMEA with their long name as an alias), contracts LAW.

Documents: each fact is stated in exactly one (main() asserts it): a profile per company (ROLE,
LOCATED_IN), a purchasing note per buyer (its SUPPLIES), a note per contract (PARTY_TO, and
APPROVED unless, half of the time, the approvals get a memo of their own). 2-6 sentences, each
fact sentence drawn from 3-5 templates ("X supplies Y with ...", "Y sources its ... from X",
"X is a key supplier to Y"; "X, headquartered in Osaka (APAC), is a vendor of ..."; "P signed
off on Contract ... on 5 March 2024"), roles said as vendor or supplier, manufacturer or
producer, plus 1-2 filler sentences naming no other entity. The title is the subject's name
(company or contract): the indexer makes a title a TOPIC node that joins any entity of its
name, so a headline would add a stray node. occurred_at runs from July to December 2024, after
the approval dates the texts state.

Provided vs text-only: a provided document carries its facts as entities and relationships
(extraction "auto", so its text is read too; ROLE becomes the company's description); the
others state them in the text only. EMEA profiles come from a structured registry (provided),
Americas profiles from the news (text), APAC ones by the company's channel; every other
document by the channel of the company that publishes it (the buyer, the contract's customer),
half of the companies publishing structured facts. A question's support is the facts its
answer is computed from, its scope included (metadata.doc_ids: their documents); its facts are
"provided" when all sit in provided documents, "text" when none do, "mixed" otherwise.

Questions: PER_TYPE a type, 1-3 wordings a subtype, picked to spread over subtypes and facts
kinds (metadata.subtype):
- count / list: the vendors or manufacturers of a region (support: the region's profiles); a
  company's suppliers or buyers; count also a company's contracts and a person's approvals.
  answer_set: the integer / the sorted names.
- follow (metadata.hops): 1 hop, a contract's approvers, a company's or a person's contracts;
  2 hops, the approvers of a company's contracts, its counterparties, the parties of a person's
  contracts, the suppliers of a company's suppliers.
- impact: every company downstream of X through SUPPLIES (hops: the farthest, at most 3), or
  within two hops when the question says so.
- compare: two companies of a tier sharing a supplier, buyer or contract; answer_set {a, b,
  shared, only_a, only_b} over their relationship neighbours (suppliers, buyers, region,
  contracts); answer "shared: ... | only A: ... | only B: ...".
- negation: the companies of a region that X does not supply directly (X left out; support:
  the region's LOCATED_IN and all of X's SUPPLIES); the vendors of a region party to no contract.
- rank: the vendor serving the most manufacturers, the company with the most suppliers,
  contracts or companies downstream (world-wide or in a region), the person with the most
  approvals, the region with the most vendors or manufacturers. answer_set: every name tied at
  the top (metadata.score); single tops are picked first. The support spans the whole scope,
  so rank questions are "mixed".
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import combinations
from pathlib import Path
from typing import Any

Fact = tuple[str, str, str]  # (kind, a, b); kind is the relationship type, or ROLE


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


TIER_SIZES = (6, 6, 7, 5)  # companies per tier: 24, in chains of three hops
VENDOR_TIERS = 2  # tiers below this sell materials and parts (vendors); the rest manufacture
MAX_SUPPLIERS = 3  # a buyer draws 1..3 suppliers from the tier below
CONTRACTS = 16  # a note each, and an approval memo for about half of them
PEOPLE = 9  # fewer approvers than contracts, so that some approve several
SECOND_APPROVER = 0.3  # share of contracts signed off by two people
SEPARATE_APPROVAL = 0.5  # share of contracts whose approvals get a memo of their own
PER_TYPE = 10  # questions per type: 70 in all
FACTS_KINDS = ("provided", "text", "mixed")  # README column order
TYPES = ("count", "list", "follow", "impact", "compare", "negation", "rank")  # file order
STEMS = words(  # invented company name stems, one per company
    "Norvale Brightwater Caldermoor Veltrix Ashgrove Quenford Torvane Halbrook Lumeris Ostwyn "
    "Penmarric Silverfen Tarrowby Elmsgate Corvath Dunmere Fairhallow Greystrand Hollisburn "
    "Marlowen Stonemere Wrenfield Zephyrine Ardentis Kilnworth"
)
SUFFIXES = (  # by tier; none is a designator that entity_key drops (Co, Ltd, ...)
    ("Materials", "Metals", "Polymers", "Alloys"), ("Components", "Electronics", "Precision"),
    ("Systems", "Devices", "Dynamics", "Assemblies"), ("Industries", "Motors", "Machines"),
)  # fmt: skip
PRODUCTS = (  # by tier, at least as many as the tier has companies
    ("specialty alloys", "polymer resins", "copper foil", "industrial glass", "silicon wafers",
     "rare-earth magnets", "carbon fibre"),
    ("sensor modules", "power converters", "wiring harnesses", "control boards", "drive motors",
     "precision bearings", "hydraulic valves"),
    ("battery packs", "cooling units", "robotic arms", "pump assemblies", "drivetrains",
     "charging stations", "gearboxes"),
    ("industrial robots", "electric buses", "agricultural drones", "smart appliances",
     "rail carriages", "forklifts", "wind turbines"),
)  # fmt: skip
REGIONS = {  # region -> headquarters cities (wording only)
    "APAC": ("Singapore", "Osaka", "Melbourne", "Penang", "Busan"),
    "EMEA": ("Rotterdam", "Lyon", "Gdansk", "Dubai", "Turin"),
    "Americas": ("Monterrey", "Toronto", "Columbus", "Curitiba", "Valparaiso"),
}
ALIASES = {"APAC": "Asia-Pacific", "EMEA": "Europe, Middle East and Africa"}  # region aliases
FIRST = words("Maren Idris Tobias Leona Anselm Priya Dario Ingrid Kofi Selma")  # approvers: first
LAST = words("Olsrud Kellan Varga Quist Morrow Haldane Brenner Okafor Castell Lindqvist")  # + last
SERVICES = (  # what a contract covers: services, never goods, so no text implies a supply link
    "maintenance", "quality auditing", "technical support", "software licensing", "logistics",
    "consulting", "training",
)  # fmt: skip
MONTHS = ("January", "February", "March", "April", "May", "June")  # approvals: first half of 2024
ROLES = {"vendor": "vendors", "manufacturer": "manufacturers"}  # role -> plural in questions
PLACES = {"APAC": "APAC", "EMEA": "EMEA", "Americas": "the Americas"}  # region after "in"
HOPS = {2: "two hops"}  # impact.within asks for these limits (one hop is list.buyers)
Wordings = dict[str, tuple[str, ...]]
SAY: Wordings = {  # fact sentences by document kind
    "profile": ("{c}, headquartered in {city} ({r}), is a {role} of {product}.",
                "{c} is a {role} of {product} based in {city}, in the {r} region.",
                "Based in {city}, {c} operates in {place} as a {role} of {product}.",
                "{c} is a {role} specialising in {product}. Its headquarters are in {city}, {r}."),
    "supplies": ("{s} supplies {b} with {product}.", "{b} sources its {product} from {s}.",
                 "{s} is a key supplier to {b}, delivering {product}.",
                 "{b} buys {product} from {s} under a multi-year agreement.",
                 "{b} relies on {s} for {product}."),
    "parties": ("{k} is a {service} agreement between {m} and {v}.",
                "{m} and {v} are the parties to {k}, a {service} agreement.",
                "{m} signed {k} with {v} for {service}."),
    "approved": ("{k} was approved by {p} on {date}.", "{p} approved {k} on {date}.",
                 "{p} signed off on {k} on {date}."),
}  # fmt: skip
FILLER: Wordings = {  # sentences naming no entity but the document's subject
    "profile": ("It employs about {n}00 people.", "The company was founded in 19{n}.",
                "It ships to customers in {n} countries."),
    "supplies": ("Average lead times were {n} weeks.", "Purchasing volumes rose {n} percent.",
                 "{x} reviewed its supplier base this quarter."),
    "parties": ("The agreement runs for {n} months.", "Payment terms are net {n} days."),
    "approved": ("The legal department closed its review of {x}.",
                 "The approval was recorded {n} days after the final draft."),
}  # fmt: skip
ASK: Wordings = {  # question wordings by type.subtype
    "count.region_role": ("How many {roles} are in the {r} region?",
                          "How many {roles} are based in {place}?",
                          "What is the number of {roles} headquartered in {place}?"),
    "count.suppliers": ("How many suppliers does {x} have?", "How many companies supply {x}?"),
    "count.buyers": ("How many companies does {x} supply?", "To how many companies does {x} sell?"),
    "count.contracts": ("How many contracts is {x} party to?", "How many contracts did {x} sign?"),
    "count.approvals": ("How many contracts did {x} approve?",),
    "list.region_role": ("Which {roles} are based in {place}?",
                         "List the {roles} in the {r} region."),
    "list.suppliers": ("List the suppliers of {x}.", "Who supplies {x}?"),
    "list.buyers": ("Which companies does {x} supply?", "Who buys from {x}?"),
    "follow.approvers": ("Who approved {x}?", "Which people signed off on {x}?"),
    "follow.contracts": ("Which contracts is {x} party to?", "List the contracts {x} has signed."),
    "follow.approved_by": ("Which contracts did {x} approve?", "What has {x} approved?"),
    "follow.company_approvers": ("Who approved the contracts that {x} is party to?",),
    "follow.counterparties": ("Which companies has {x} signed contracts with?",),
    "follow.person_parties": ("Which companies are party to contracts approved by {x}?",),
    "follow.upstream2": ("Who supplies the suppliers of {x}?",
                         "Which companies are two steps upstream of {x} in its supply chain?"),
    "impact.all": ("What is affected if {x} goes bankrupt?",
                   "If {x} fails, which companies are affected downstream?",
                   "Which companies would be disrupted if {x} stopped deliveries?"),
    "impact.within": ("Which companies are at most {n} downstream of {x} in the supply chain?",
                      "If {x} failed, who would be hit within {n} of it down the supply chain?"),
    "compare.pair": ("Compare {a} and {b}.", "How do {a} and {b} compare in their relationships?",
                     "What do {a} and {b} have in common, and what sets them apart?"),
    "negation.companies": ("Which companies in {place} are not supplied by {x}?",
                           "Which {r} companies does {x} not supply?"),
    "negation.no_contract": ("Which vendors in {place} are not party to any contract?",
                             "Which {r} vendors have no contract?"),
    "rank.serves": ("Which{where} supplier serves the most manufacturers?",
                    "Which{where} vendor supplies the most manufacturers?"),
    "rank.suppliers": ("Which{where} company has the most suppliers?",),
    "rank.contracts": ("Which{where} company is party to the most contracts?",),
    "rank.impact": ("Which{where} company's failure would affect the most companies downstream?",),
    "rank.approvals": ("Who approved the most contracts?",),
    "rank.region": ("Which region has the most {roles}?",),
}  # fmt: skip
ONE_HOP = (  # (count subtype or "", list subtype, kind, the subject is the fact's source)
    ("count.suppliers", "list.suppliers", "SUPPLIES", False),
    ("count.buyers", "list.buyers", "SUPPLIES", True),
    ("count.contracts", "follow.contracts", "PARTY_TO", True),
    ("count.approvals", "follow.approved_by", "APPROVED", True),
    ("", "follow.approvers", "APPROVED", False),
)
TWO_HOP = (  # (subtype, first step, second step); a step is (kind, forward)
    ("follow.upstream2", ("SUPPLIES", False), ("SUPPLIES", False)),
    ("follow.company_approvers", ("PARTY_TO", True), ("APPROVED", False)),
    ("follow.counterparties", ("PARTY_TO", True), ("PARTY_TO", False)),
    ("follow.person_parties", ("APPROVED", True), ("PARTY_TO", False)),
)


@dataclass(frozen=True)
class Company:
    name: str
    tier: int
    region: str
    city: str
    product: str
    role: str


@dataclass
class World:
    companies: dict[str, Company]
    contracts: dict[str, tuple[str, str, str]]  # name -> (customer, vendor, service)
    people: list[str]
    facts: list[Fact]  # sorted: lookups below return sorted names

    def rel(self, kind: str, a: str | None = None, b: str | None = None) -> list[Fact]:
        return [f for f in self.facts if f[0] == kind and a in (None, f[1]) and b in (None, f[2])]

    def step(self, kind: str, forward: bool, x: str) -> list[Fact]:
        return self.rel(kind, a=x) if forward else self.rel(kind, b=x)

    def profile(self, cs: Iterable[str]) -> list[Fact]:
        return [f for f in self.facts if f[0] in ("ROLE", "LOCATED_IN") and f[1] in set(cs)]

    def downstream(self, x: str, limit: int = 3) -> tuple[dict[str, int], list[Fact]]:
        """Company -> hops from ``x`` along SUPPLIES (up to ``limit``), and the edges walked."""
        dist: dict[str, int] = {}
        edges: list[Fact] = []
        frontier = [x]
        for hop in range(1, limit + 1):
            edges += (walked := [f for s in frontier for f in self.rel("SUPPLIES", a=s)])
            frontier = sorted({f[2] for f in walked} - dist.keys())
            dist.update(dict.fromkeys(frontier, hop))
        return dist, edges

    def links(self, c: str) -> dict[str, Fact]:
        """Relationship neighbour of company ``c`` -> the fact linking them."""
        return {f[2] if f[1] == c else f[1]: f for f in self.facts if f[0] != "ROLE" and c in f}


def build_world(rng: random.Random) -> World:
    stems = rng.sample(STEMS, sum(TIER_SIZES))
    companies: dict[str, Company] = {}
    for tier, size in enumerate(TIER_SIZES):
        products = rng.sample(PRODUCTS[tier], size)
        offset = rng.randrange(len(REGIONS))  # regions in turn: each gets a share of every tier
        for i in range(size):
            region = list(REGIONS)[(i + offset) % len(REGIONS)]
            name = f"{stems.pop()} {rng.choice(SUFFIXES[tier])}"
            role = "vendor" if tier < VENDOR_TIERS else "manufacturer"
            companies[name] = Company(name, tier, region, rng.choice(REGIONS[region]),
                                      products[i], role)  # fmt: skip
    tiers = [[c for c in companies if companies[c].tier == t] for t in range(len(TIER_SIZES))]
    supplies: set[tuple[str, str]] = set()
    for t in range(1, len(tiers)):
        for b in tiers[t]:
            n = rng.randint(1, min(MAX_SUPPLIERS, len(tiers[t - 1])))
            supplies |= {(s, b) for s in rng.sample(tiers[t - 1], n)}
        for s in tiers[t - 1]:  # nobody below the top tier is left without a buyer
            if not any(u == s for u, _ in supplies):
                supplies.add((s, rng.choice(tiers[t])))
    vendors = [c for c in companies if companies[c].role == "vendor"]
    makers = [c for c in companies if companies[c].role == "manufacturer"]
    direct = sorted((m, v) for v, m in supplies if v in vendors and m in makers)
    pairs = rng.sample(direct, min(len(direct), CONTRACTS // 2))  # half on a supply link
    pairs += rng.sample(sorted({(m, v) for m in makers for v in vendors} - set(pairs)),
                        CONTRACTS - len(pairs))  # fmt: skip
    people = [f"{a} {b}" for a, b in zip(rng.sample(FIRST, PEOPLE), rng.sample(LAST, PEOPLE),
                                         strict=True)]  # fmt: skip
    contracts: dict[str, tuple[str, str, str]] = {}
    facts = {("SUPPLIES", s, b) for s, b in supplies}
    facts |= {f for c in companies.values()
              for f in (("ROLE", c.name, c.role), ("LOCATED_IN", c.name, c.region))}  # fmt: skip
    for i, ((m, v), num) in enumerate(zip(pairs, sorted(rng.sample(range(1, 120), CONTRACTS)),
                                          strict=True)):  # fmt: skip
        k = f"Contract {''.join(word[0] for word in m.split())}-2024-{num:03d}"
        contracts[k] = (m, v, rng.choice(SERVICES))
        approvers = {people[i % PEOPLE]}  # in turn, so that everyone approves something
        if rng.random() < SECOND_APPROVER:
            approvers.add(rng.choice(people))
        facts |= {("PARTY_TO", m, k), ("PARTY_TO", v, k)} | {("APPROVED", p, k) for p in approvers}
    return World(companies, contracts, people, sorted(facts))


@dataclass
class Doc:
    kind: str  # profile | supplies | parties | approved: the sentences it holds
    subject: str  # its title: the company or contract it is about
    source: str
    provided: bool
    facts: list[Fact] = field(default_factory=list)
    sentences: list[str] = field(default_factory=list)


def build_docs(w: World, rng: random.Random) -> list[Doc]:
    structured = set(rng.sample(sorted(w.companies), len(w.companies) // 2))  # publish facts

    def say(doc: Doc, facts: list[Fact], key: str = "", **kw: str) -> Doc:
        doc.sentences.append(rng.choice(SAY[key or doc.kind]).format(**kw))
        doc.facts += facts
        return doc

    def filler(doc: Doc, upto: int) -> Doc:
        for text in rng.sample(FILLER[doc.kind], rng.randint(1, upto)):
            doc.sentences.append(text.format(x=doc.subject, n=rng.randint(12, 60)))
        return doc

    docs, memos = [], []
    for c in w.companies.values():
        provided = {"EMEA": True, "Americas": False}.get(c.region, c.name in structured)
        doc = Doc("profile", c.name, "registry" if provided else "news", provided)
        role = rng.choice([c.role, "supplier" if c.role == "vendor" else "producer"])
        kw = {"c": c.name, "city": c.city, "r": c.region, "place": PLACES[c.region]}
        docs.append(filler(say(doc, w.profile([c.name]), role=role, product=c.product, **kw), 2))
    for b in w.companies:
        if edges := w.rel("SUPPLIES", b=b):
            doc = Doc("supplies", b, "procurement", b in structured)
            for f in rng.sample(edges, len(edges)):
                say(doc, [f], s=f[1], b=b, product=w.companies[f[1]].product)
            docs.append(filler(doc, 2))
    for k, (m, v, service) in w.contracts.items():
        doc = Doc("parties", k, "legal", m in structured)
        docs.append(filler(say(doc, w.rel("PARTY_TO", b=k), k=k, m=m, v=v, service=service), 1))
        if rng.random() < SEPARATE_APPROVAL:  # else the approvals go in the contract's note
            memos.append(doc := Doc("approved", k, "legal", doc.provided))
        for f in w.rel("APPROVED", b=k):
            date = f"{rng.randint(1, 28)} {rng.choice(MONTHS)} 2024"
            say(doc, [f], "approved", k=k, p=f[1], date=date)
        if doc.kind == "approved":
            filler(doc, 1)
    return docs + memos


def facts_payload(w: World, facts: list[Fact]) -> dict[str, Any]:
    """The provided ``entities`` and ``relationships`` stating ``facts``."""
    ents: dict[str, dict[str, Any]] = {}
    for name in (n for kind, a, b in facts for n in ((a,) if kind == "ROLE" else (a, b))):
        etype = "ORG" if name in w.companies else "LAW" if name in w.contracts else "PERSON"
        ents.setdefault(name, {"name": name, "type": "LOC" if name in REGIONS else etype})
        if name in ALIASES:
            ents[name]["aliases"] = [ALIASES[name]]
    for _, c, role in (f for f in facts if f[0] == "ROLE"):
        ents[c]["description"] = f"{role} of {w.companies[c].product}"
    rels = [{"source": a, "target": b, "type": kind} for kind, a, b in facts if kind != "ROLE"]
    return {"extraction": "auto", "entities": list(ents.values()), "relationships": rels}


def events(w: World, docs: list[Doc], seed: int) -> list[dict[str, Any]]:
    start = datetime(2024, 7, 1, 9, tzinfo=UTC)  # after every approval date the texts state
    out: list[dict[str, Any]] = []
    for i, doc in enumerate(docs):
        at = start + timedelta(days=i * 180 // len(docs), hours=i % 8)
        out.append({
            "schema_version": 2, "event_id": f"gc-{i + 1:04d}@1", "type": "upsert",
            "doc_id": f"gc-{i + 1:04d}", "version": 1, "title": doc.subject,
            "text": " ".join(doc.sentences), "occurred_at": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "metadata": {"source": doc.source, "title": doc.subject, "kind": doc.kind,
                         "corpus": "graph_corpus", "seed": seed},
            **(facts_payload(w, doc.facts) if doc.provided else {}),
        })  # fmt: skip
    return out


@dataclass(frozen=True, eq=False)
class Q:
    key: str  # type.subtype
    text: str
    answer: int | list[str] | dict[str, Any]
    support: tuple[Fact, ...]
    meta: dict[str, int]
    tied: bool = False  # rank: several names share the top


def questions(w: World, rng: random.Random) -> list[Q]:  # noqa: PLR0912 (one block a type)
    out: list[Q] = []

    def add(key: str, answer: Any, support: Iterable[Fact], meta: Any = None, **kw: Any) -> None:
        text = rng.choice(ASK[key]).format(place=PLACES.get(kw.get("r", "")), **kw)
        tied = key.startswith("rank.") and len(answer) > 1
        out.append(Q(key, text, answer, tuple(support), meta or {}, tied))

    for r in REGIONS:
        scope = [f[1] for f in w.rel("LOCATED_IN", b=r)]
        for role, roles in ROLES.items():
            items = [f[1] for f in w.rel("ROLE", b=role) if f[1] in scope]
            add("count.region_role", len(items), w.profile(scope), r=r, roles=roles)
            add("list.region_role", items, w.profile(scope), r=r, roles=roles)
        vendors = [f[1] for f in w.rel("ROLE", b="vendor") if f[1] in scope]
        if idle := [c for c in vendors if not w.rel("PARTY_TO", a=c)]:
            support = w.profile(scope) + [f for f in w.rel("PARTY_TO") if f[1] in vendors]
            add("negation.no_contract", idle, support, r=r)
    for count_key, list_key, kind, forward in ONE_HOP:
        for x in dict.fromkeys(f[1 if forward else 2] for f in w.rel(kind)):
            found = w.step(kind, forward, x)
            items = [f[2 if forward else 1] for f in found]
            if count_key:
                add(count_key, len(items), found, x=x)
            add(list_key, items, found, {"hops": 1} if "follow" in list_key else None, x=x)
    for key, (k1, f1), (k2, f2) in TWO_HOP:
        for x in dict.fromkeys(f[1 if f1 else 2] for f in w.rel(k1)):
            first = w.step(k1, f1, x)
            second = [g for f in first for g in w.step(k2, f2, f[2 if f1 else 1])]
            if items := sorted({g[2 if f2 else 1] for g in second} - {x}):
                add(key, items, first + second, {"hops": 2}, x=x)
    for x in dict.fromkeys(f[1] for f in w.rel("SUPPLIES")):
        down, edges = w.downstream(x)
        add("impact.all", sorted(down), edges, {"hops": max(down.values())}, x=x)
        for n in (n for n in HOPS if n < max(down.values())):
            near, walked = w.downstream(x, n)
            add("impact.within", sorted(near), walked, {"hops": n}, x=x, n=HOPS[n])
        buyers = {f[2] for f in w.rel("SUPPLIES", a=x)}
        for r in REGIONS:
            located = [f for f in w.rel("LOCATED_IN", b=r) if f[1] != x]
            if buyers & {f[1] for f in located}:
                rest = sorted({f[1] for f in located} - buyers)
                add("negation.companies", rest, located + w.rel("SUPPLIES", a=x), r=r, x=x)
    for t in range(len(TIER_SIZES)):
        for a, b in combinations(sorted(c.name for c in w.companies.values() if c.tier == t), 2):
            la, lb = w.links(a), w.links(b)
            if la.keys() & (lb.keys() - REGIONS.keys()):  # more in common than a region
                shared = sorted(la.keys() & lb.keys())
                answer = {"a": a, "b": b, "shared": shared, "only_a": sorted(la.keys() - lb.keys()),
                          "only_b": sorted(lb.keys() - la.keys())}  # fmt: skip
                add("compare.pair", answer, {**la, **lb}.values(), a=a, b=b)
    for key, scores, support, kw in rankings(w):
        best = max(len(v) for v in scores.values())
        if best:
            names = sorted(n for n, v in scores.items() if len(v) == best)
            add(key, names, support, {"score": best}, **kw)
    return [q for q in out if q.answer or q.answer == 0]


Ranking = tuple[str, dict[str, list[Any]], list[Fact], dict[str, str]]  # see rankings()


def rankings(w: World) -> list[Ranking]:
    """(subtype, name -> what it is scored by (the count), support, wording fields)."""
    out: list[Ranking] = []
    for r in (None, *REGIONS):
        scope = [c for c in w.companies if r in (None, w.companies[c].region)]
        located = [f for f in w.rel("LOCATED_IN") if r and f[1] in scope]
        kw = {"where": f" {r}" if r else ""}
        vendors = [c for c in scope if w.companies[c].role == "vendor"]
        sales = [f for v in vendors for f in w.rel("SUPPLIES", a=v)]
        serves = {v: [f for f in sales if f[1] == v and w.companies[f[2]].role == "manufacturer"]
                  for v in vendors}  # fmt: skip
        out.append(("rank.serves", serves, located + w.rel("ROLE") + sales, kw))
        for key, kind, forward in (("rank.suppliers", "SUPPLIES", False),
                                   ("rank.contracts", "PARTY_TO", True)):  # fmt: skip
            scores = {c: w.step(kind, forward, c) for c in scope}
            out.append((key, scores, located + [f for v in scores.values() for f in v], kw))
        impact = {c: list(w.downstream(c)[0]) for c in scope}
        out.append(("rank.impact", impact, w.rel("SUPPLIES") + located, kw))
    approvals = {p: w.rel("APPROVED", a=p) for p in w.people}
    out.append(("rank.approvals", approvals, w.rel("APPROVED"), {}))
    for role, roles in ROLES.items():
        by_region = {r: [f for f in w.rel("ROLE", b=role) if w.companies[f[1]].region == r]
                     for r in REGIONS}  # fmt: skip
        out.append(("rank.region", by_region, w.profile(w.companies), {"roles": roles}))
    return out


def pick(cands: list[Q], kind: dict[Q, str], rng: random.Random) -> list[Q]:
    """PER_TYPE of ``cands``: single-top ranks first, then spread over subtypes and facts."""
    order = rng.sample(cands, len(cands))
    chosen: list[Q] = []
    subs, kinds = Counter[str](), Counter[str]()
    while order and len(chosen) < PER_TYPE:
        best = min(order, key=lambda c: (c.tied, subs[c.key] + kinds[kind[c]], order.index(c)))
        order.remove(best)
        chosen.append(best)
        subs[best.key] += 1
        kinds[kind[best]] += 1
    return sorted(chosen, key=cands.index)


def render(q: Q, qid: str, kind: str, doc_of: dict[Fact, str]) -> dict[str, Any]:
    if isinstance(q.answer, dict):
        parts = (("shared", "shared"), (f"only {q.answer['a']}", "only_a"),
                 (f"only {q.answer['b']}", "only_b"))  # fmt: skip
        answer = " | ".join(f"{label}: {'; '.join(q.answer[p]) or 'none'}" for label, p in parts)
    else:
        answer = "; ".join(q.answer) if isinstance(q.answer, list) else str(q.answer)
    qtype, subtype = q.key.split(".")
    meta = {**q.meta, "subtype": subtype, "doc_ids": sorted({doc_of[f] for f in q.support})}
    return {"qid": qid, "question": q.text, "question_type": qtype, "answer": answer,
            "answer_set": q.answer, "facts": kind, "metadata": meta}  # fmt: skip


def readme(evs: list[dict[str, Any]], qs: list[dict[str, Any]], seed: int) -> str:
    provided, kinds = sum("entities" in e for e in evs), Counter(e["metadata"]["kind"] for e in evs)
    n = Counter((q["question_type"], q["facts"]) for q in qs)
    rows = [f"| {t} | " + " | ".join(str(n[t, k]) for k in FACTS_KINDS)
            + f" | {sum(n[t, k] for k in FACTS_KINDS)} |" for t in TYPES]  # fmt: skip
    total = " | ".join(str(sum(n[t, k] for t in TYPES)) for k in FACTS_KINDS)
    return f"""# Graph questions corpus (issue 33)

A small **synthetic** corpus with known answers to graph questions (count, list, follow,
impact, compare, negation, rank). Every company, person and contract in it is invented. It is
generated by `bench/graph_corpus.py` (seed {seed}), whose docstring describes the world, the
wording and how each answer is derived; do not edit these files by hand. To regenerate them
(byte for byte):

    .venv/bin/python bench/graph_corpus.py --out bench/graph_corpus --seed {seed}

Licence: the project's own (Apache-2.0).

- `events.jsonl`: {len(evs)} document events (`schemas/document_event.v2.json`): {provided} carry
  their facts as `entities` and `relationships` (`extraction` "auto"), {len(evs) - provided}
  state them in the text only. {kinds["profile"]} company profiles, {kinds["supplies"]} purchasing
  notes, {kinds["parties"]} contract notes, {kinds["approved"]} approval memos.
- `questions.jsonl`: {len(qs)} questions: `qid`, `question`, `question_type`, `answer`,
  `answer_set`, `facts` (are the supporting facts provided, text-only or mixed), `metadata`
  (`subtype`, the supporting documents' `doc_ids`, `hops` for follow and impact, `score` for
  rank).

| type | provided | text | mixed | all |
|---|---|---|---|---|
{chr(10).join(rows)}
| all | {total} | {len(qs)} |
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/graph_corpus"))
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    world = build_world(rng)
    docs = build_docs(world, rng)
    evs = events(world, docs, args.seed)
    doc_of = {f: ev["doc_id"] for ev, d in zip(evs, docs, strict=True) for f in d.facts}
    assert len(doc_of) == sum(len(d.facts) for d in docs), "a fact is stated twice"
    assert sorted(doc_of) == world.facts, "a fact of the world is stated nowhere"
    provided = {ev["doc_id"] for ev in evs if "entities" in ev}
    cands = questions(world, rng)
    kind: dict[Q, str] = {}
    for c in cands:
        flags = {doc_of[f] in provided for f in c.support}
        kind[c] = "provided" if flags == {True} else "text" if flags == {False} else "mixed"
    chosen = [c for t in TYPES for c in pick([c for c in cands if c.key.startswith(t + ".")],
                                             kind, rng)]  # fmt: skip
    qs = [render(c, f"gq-{i + 1:03d}", kind[c], doc_of) for i, c in enumerate(chosen)]
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("events.jsonl", evs), ("questions.jsonl", qs)):
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        (args.out / name).write_text(text, encoding="utf-8", newline="\n")
    (args.out / "README.md").write_text(readme(evs, qs, args.seed), encoding="utf-8", newline="\n")
    by = {key: Counter(q[key] for q in qs) for key in ("question_type", "facts")}
    print(json.dumps({"events": len(evs), "provided": len(provided), "questions": len(qs), **by}))


if __name__ == "__main__":
    main()
