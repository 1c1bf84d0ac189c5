"""``manage.py ard_evaluate QUERY_FILE``: top-3 hits and MRR of a query file (docs/ard.md)."""

from django.core.management.base import BaseCommand, CommandError

from ard.evaluation import evaluate, read_queries


class Command(BaseCommand):
    help = (
        "Run a file of (query, intended agent id) pairs through the search ranking and print "
        "each query's top 3, the queries with their agent in the top 3, and the MRR."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("query_file", help="JSON pairs or `query<TAB>agent id` lines")
        parser.add_argument("--misses", action="store_true", help="print only the misses")

    def handle(self, *args, query_file: str, misses: bool = False, **options) -> None:
        try:
            queries = read_queries(query_file)
        except (OSError, ValueError, KeyError, IndexError) as exc:
            raise CommandError(f"cannot read {query_file}: {exc}") from exc
        if not queries:
            raise CommandError(f"{query_file} holds no query")
        report = evaluate(queries)
        for o in report.outcomes:
            hit = o.rank is not None and o.rank <= 3
            if misses and hit:
                continue
            top = ", ".join(f"{a} {s}" for a, s in o.top) or "(nothing)"
            where = f"rank {o.rank}" if o.rank else "not matched"
            self.stdout.write(f"{'ok  ' if hit else 'MISS'} {o.query!r} -> {o.wanted} ({where}); "
                              f"top 3: {top}")
        n = len(report.outcomes)
        self.stdout.write(f"top 3: {report.top3}/{n} ({100 * report.top3 / n:.1f} %), "
                          f"MRR {report.mrr:.3f}")
