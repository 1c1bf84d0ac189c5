"""A held-out relevance set for the cards of tests/ard/corpus.py: 45 queries written by a
different method than ``QUERIES`` -- from each agent's purpose alone, without reading its card,
as paraphrases, synonyms, loan words from other languages, misspellings, and intents that share
no word with the card. No ranking parameter is tuned on this set (the fusion weights are chosen
on ``QUERIES``); it measures how the ranking carries over to wording nobody tuned for."""

from __future__ import annotations

#: (query, the agent a person asking it wants).
HELDOUT: list[tuple[str, str]] = [
    # intent without a card word
    ("do I need an umbrella when I go out later", "weather"),
    ("what should I wear in Oslo on Thursday", "weather"),
    ("cheapest way to fly to Rome in June", "flights"),
    ("swap dollars for pesos before my holiday", "currency"),
    ("is this pull request safe to ship", "code-review"),
    ("say this sentence in German", "translator"),
    ("a bed and breakfast near the old town", "hotels"),
    ("find a free slot for a call with Anna on Tuesday", "calendar"),
    ("draft a polite reply declining the invitation", "email"),
    ("something vegetarian to cook tonight", "recipes"),
    ("is Apple a good buy today on the Nasdaq", "stocks"),
    ("can I deduct my home office", "tax"),
    ("is this non-compete clause enforceable", "legal"),
    ("I want my money back for a broken blender", "support"),
    ("how do I get from the airport to downtown by bus", "maps"),
    ("latest headlines about the election", "news"),
    ("select every customer who signed up last year", "sql"),
    ("draw a watercolour of a lighthouse at sunset", "images"),
    ("turn my podcast audio into a written transcript", "transcribe"),
    ("tl;dr this article for me", "summarizer"),
    ("exercises to build stronger legs at home", "fitness"),
    ("should I see a physician about this rash", "doctor"),
    ("best deal on running shoes", "shopping"),
    ("update my CV and find openings for nurses", "jobs"),
    ("a two-bedroom flat to lease downtown", "realestate"),
    ("what is ethereum trading at", "crypto"),
    ("send a payment reminder for an overdue bill", "invoices"),
    ("explain photosynthesis to my 12 year old", "tutor"),
    ("scan our website for OWASP issues", "security"),
    ("what is on at the theatre this weekend", "events"),
    ("rent a vehicle at Lisbon airport", "car-rental"),
    # loan words and other languages' words
    ("wetter in Berlin morgen", "weather"),
    ("un vuelo barato a Madrid", "flights"),
    ("traduire ce texte en anglais", "translator"),
    ("rendezvous with the sales team on Friday", "calendar"),
    # misspellings
    ("wheather forcast for the weekend", "weather"),
    ("convrt 100 pounds to eruos", "currency"),
    ("recipie for banana bread", "recipes"),
    ("bitcoin pryce today", "crypto"),
    ("hotell room in Paris", "hotels"),
    ("summerize these meeting notes", "summarizer"),
    # paraphrases
    ("a place to sleep in Vienna for the weekend", "hotels"),
    ("remind me to call mum at six", "calendar"),
    ("how many calories should I eat to lose weight", "fitness"),
    ("write the query for the total sales per region", "sql"),
]
