"""Thirty realistic A2A agent cards and thirty natural-language queries, each with the agent a
person asking it wants. The relevance test asks that agent to be in the top 3 for at least 27
of the 30 queries, on SQLite (FTS5) and PostgreSQL (tsvector)."""

from __future__ import annotations

from typing import Any


def _card(agent_id: str, name: str, description: str, skills: list[tuple]) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "url": f"http://127.0.0.1:9/{agent_id}",
        "version": "1.0.0",
        "protocolVersion": "0.3.0",
        "capabilities": {"streaming": False},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [
            {
                "id": sid,
                "name": sname,
                "description": sdesc,
                "tags": list(tags),
                "examples": list(examples),
            }
            for sid, sname, sdesc, tags, examples in skills
        ],
    }


CARDS: dict[str, dict[str, Any]] = {
    "weather": _card(
        "weather",
        "Weather Forecaster",
        "Current conditions and multi-day weather forecasts for any city worldwide.",
        [
            (
                "forecast",
                "Weather forecast",
                "Hourly and 7-day forecasts: temperature, rain, wind.",
                ["weather", "forecast"],
                ["Will it rain in Seattle tomorrow?", "7-day forecast for Berlin"],
            ),
            (
                "current",
                "Current conditions",
                "Temperature, humidity and wind right now.",
                ["weather"],
                ["What's the temperature in Tokyo right now?"],
            ),
        ],
    ),
    "flights": _card(
        "flights",
        "Flight Finder",
        "Searches airlines for flights, compares fares and books plane tickets.",
        [
            (
                "search-flights",
                "Search flights",
                "Find flights between airports on given dates.",
                ["travel", "flights", "airline"],
                [
                    "Find me a flight from Paris to New York next Friday",
                    "cheapest nonstop to Lisbon in May",
                ],
            ),
            (
                "book-flight",
                "Book flight",
                "Book a seat on a chosen flight.",
                ["booking"],
                ["Book the 9am flight to Boston"],
            ),
        ],
    ),
    "currency": _card(
        "currency",
        "Currency Exchange",
        "Converts money between currencies with live foreign exchange rates.",
        [
            (
                "convert",
                "Convert currency",
                "Convert an amount from one currency to another.",
                ["finance", "forex", "currency"],
                ["Convert 100 US dollars to euros", "How many yen is 50 pounds?"],
            ),
            (
                "rates",
                "Exchange rates",
                "Latest and historical exchange rates.",
                ["forex"],
                ["EUR to CHF exchange rate last month"],
            ),
        ],
    ),
    "code-review": _card(
        "code-review",
        "Code Reviewer",
        "Reviews pull requests and source code for bugs, style problems and security issues.",
        [
            (
                "review-pr",
                "Review pull request",
                "Comment on a GitHub or GitLab pull request diff.",
                ["code", "review", "github"],
                ["Review my pull request for bugs", "Check this diff for security problems"],
            ),
            (
                "lint",
                "Style check",
                "Point out style and readability problems in code.",
                ["code", "lint"],
                ["Is this Python function idiomatic?"],
            ),
        ],
    ),
    "translator": _card(
        "translator",
        "Translator",
        "Translates text and documents between more than 100 languages.",
        [
            (
                "translate",
                "Translate text",
                "Translate text into another language.",
                ["language", "translation"],
                ["Translate this paragraph into German", "How do you say thank you in Japanese?"],
            ),
            (
                "detect",
                "Detect language",
                "Identify which language a text is written in.",
                ["language"],
                ["What language is this sentence?"],
            ),
        ],
    ),
    "hotels": _card(
        "hotels",
        "Hotel Booker",
        "Finds hotel rooms and accommodation and makes reservations.",
        [
            (
                "search-hotels",
                "Search hotels",
                "Hotels and rooms by city, dates, price and rating.",
                ["travel", "hotel", "accommodation"],
                ["Find a hotel in Rome for three nights", "cheap rooms near Times Square"],
            ),
            (
                "reserve",
                "Reserve room",
                "Reserve a room and confirm the booking.",
                ["booking"],
                ["Reserve a double room at the Hilton"],
            ),
        ],
    ),
    "calendar": _card(
        "calendar",
        "Calendar Assistant",
        "Schedules meetings, checks availability and manages calendar events.",
        [
            (
                "schedule",
                "Schedule meeting",
                "Create calendar events and invite attendees.",
                ["calendar", "meetings", "scheduling"],
                ["Schedule a meeting with Anna on Tuesday", "Set up a call with the team at 3pm"],
            ),
            (
                "availability",
                "Check availability",
                "Find free time slots for attendees.",
                ["calendar"],
                ["When am I free this week?"],
            ),
        ],
    ),
    "email": _card(
        "email",
        "Email Writer",
        "Drafts, summarizes and replies to email messages.",
        [
            (
                "draft",
                "Draft email",
                "Write an email from a short instruction.",
                ["email", "writing"],
                [
                    "Draft an email to my landlord about the broken heater",
                    "Write a polite follow-up email",
                ],
            ),
            (
                "summarize-inbox",
                "Summarize inbox",
                "Summarize unread email messages.",
                ["email"],
                ["Summarize my unread messages"],
            ),
        ],
    ),
    "recipes": _card(
        "recipes",
        "Recipe Chef",
        "Suggests recipes and meal plans from ingredients, diets and cuisines.",
        [
            (
                "suggest-recipe",
                "Suggest recipe",
                "Recipes from the ingredients you have.",
                ["cooking", "food", "recipes"],
                ["What can I cook with chicken and rice?", "A vegetarian lasagna recipe"],
            ),
            (
                "meal-plan",
                "Meal plan",
                "A weekly meal plan for a diet.",
                ["food", "nutrition"],
                ["Plan a week of low-carb dinners"],
            ),
        ],
    ),
    "stocks": _card(
        "stocks",
        "Stock Market Analyst",
        "Stock quotes, company fundamentals and market news for equities.",
        [
            (
                "quote",
                "Stock quote",
                "Current share price and daily change of a ticker.",
                ["finance", "stocks", "market"],
                ["What is Apple's stock price?", "How did NVDA shares do today?"],
            ),
            (
                "fundamentals",
                "Company fundamentals",
                "Earnings, P/E ratio and revenue.",
                ["finance", "stocks"],
                ["Show Tesla's earnings per share"],
            ),
        ],
    ),
    "tax": _card(
        "tax",
        "Tax Advisor",
        "Answers income tax questions and estimates tax returns and deductions.",
        [
            (
                "estimate",
                "Estimate tax",
                "Estimate income tax owed or refund.",
                ["tax", "finance"],
                ["How much income tax will I pay on 80,000?", "Estimate my tax refund"],
            ),
            (
                "deductions",
                "Deductions",
                "Which expenses are tax deductible.",
                ["tax"],
                ["Can I deduct my home office?"],
            ),
        ],
    ),
    "legal": _card(
        "legal",
        "Contract Reviewer",
        "Reads legal contracts and flags risky clauses, obligations and deadlines.",
        [
            (
                "review-contract",
                "Review contract",
                "Summarize a contract and flag risky clauses.",
                ["legal", "contracts"],
                [
                    "Review this NDA for risky clauses",
                    "What are my obligations in this lease agreement?",
                ],
            ),
        ],
    ),
    "support": _card(
        "support",
        "Customer Support",
        "Answers customer questions about orders, shipping, returns and refunds.",
        [
            (
                "order-status",
                "Order status",
                "Where an order is and when it arrives.",
                ["support", "orders", "shipping"],
                ["Where is my order 12345?", "When will my package arrive?"],
            ),
            (
                "returns",
                "Returns and refunds",
                "Start a return or refund for an order.",
                ["support", "returns", "refunds"],
                ["I want to return these shoes"],
            ),
        ],
    ),
    "maps": _card(
        "maps",
        "Navigator",
        "Driving, walking and transit directions, routes and travel times.",
        [
            (
                "directions",
                "Directions",
                "Turn-by-turn route between two places.",
                ["maps", "directions", "navigation"],
                [
                    "How do I get from the airport to downtown?",
                    "Walking route to the nearest pharmacy",
                ],
            ),
            (
                "traffic",
                "Traffic",
                "Live traffic and travel time estimates.",
                ["maps", "traffic"],
                ["How long is the drive to Boston with traffic?"],
            ),
        ],
    ),
    "news": _card(
        "news",
        "News Briefing",
        "Summarizes today's headlines and news stories by topic.",
        [
            (
                "headlines",
                "Headlines",
                "Top news headlines by topic or country.",
                ["news", "media"],
                ["What are today's top headlines?", "Latest technology news"],
            ),
        ],
    ),
    "sql": _card(
        "sql",
        "SQL Assistant",
        "Writes and explains SQL queries for PostgreSQL, MySQL and SQLite databases.",
        [
            (
                "write-sql",
                "Write SQL",
                "Turn a question into a SQL query.",
                ["database", "sql", "code"],
                [
                    "Write a query for the top 10 customers by revenue",
                    "Join orders and customers tables",
                ],
            ),
            (
                "explain-sql",
                "Explain SQL",
                "Explain what a SQL query does and how to speed it up.",
                ["database", "sql"],
                ["Why is this query slow?"],
            ),
        ],
    ),
    "images": _card(
        "images",
        "Image Generator",
        "Creates images, illustrations and logos from text prompts.",
        [
            (
                "generate-image",
                "Generate image",
                "Draw a picture from a description.",
                ["image", "art", "design"],
                ["Draw a cat wearing a space suit", "Design a logo for my bakery"],
            ),
        ],
    ),
    "transcribe": _card(
        "transcribe",
        "Transcriber",
        "Transcribes audio recordings and meetings into text.",
        [
            (
                "transcribe-audio",
                "Transcribe audio",
                "Speech to text for audio files.",
                ["audio", "speech", "transcription"],
                ["Transcribe this podcast episode", "Turn my voice memo into text"],
            ),
        ],
    ),
    "summarizer": _card(
        "summarizer",
        "Document Summarizer",
        "Summarizes long documents, reports and articles into key points.",
        [
            (
                "summarize",
                "Summarize document",
                "Key points of a PDF, report or article.",
                ["documents", "summary"],
                ["Summarize this 40-page report", "Give me the key points of this article"],
            ),
        ],
    ),
    "fitness": _card(
        "fitness",
        "Fitness Coach",
        "Builds workout plans and training programs for strength and running.",
        [
            (
                "workout",
                "Workout plan",
                "A training plan for a goal and schedule.",
                ["fitness", "health", "exercise"],
                [
                    "Make me a 12-week marathon training plan",
                    "Workout routine to build muscle at home",
                ],
            ),
        ],
    ),
    "doctor": _card(
        "doctor",
        "Symptom Checker",
        "Explains symptoms and medical conditions and suggests when to see a doctor.",
        [
            (
                "symptoms",
                "Check symptoms",
                "Possible causes of symptoms and urgency.",
                ["health", "medical"],
                [
                    "I have a headache and a fever, what could it be?",
                    "Is chest pain after running serious?",
                ],
            ),
        ],
    ),
    "shopping": _card(
        "shopping",
        "Shopping Assistant",
        "Compares products and prices across online stores and finds deals.",
        [
            (
                "compare-prices",
                "Compare prices",
                "Best price for a product across shops.",
                ["shopping", "ecommerce", "deals"],
                ["Find the cheapest price for AirPods", "Compare these two laptops"],
            ),
        ],
    ),
    "jobs": _card(
        "jobs",
        "Job Search",
        "Finds job openings and helps write resumes and cover letters.",
        [
            (
                "find-jobs",
                "Find jobs",
                "Job listings by role, location and salary.",
                ["jobs", "careers", "recruiting"],
                ["Find remote Python developer jobs", "Nursing jobs in Chicago"],
            ),
            (
                "resume",
                "Resume help",
                "Improve a resume or cover letter.",
                ["careers"],
                ["Improve my resume for a product manager role"],
            ),
        ],
    ),
    "realestate": _card(
        "realestate",
        "Property Finder",
        "Searches homes and apartments for sale or rent and estimates property values.",
        [
            (
                "listings",
                "Property listings",
                "Houses and apartments for sale or rent.",
                ["real-estate", "housing"],
                [
                    "Two-bedroom apartments for rent in Austin",
                    "Houses for sale under 400k with a garden",
                ],
            ),
            (
                "valuation",
                "Home valuation",
                "Estimate what a property is worth.",
                ["real-estate"],
                ["What is my house worth?"],
            ),
        ],
    ),
    "crypto": _card(
        "crypto",
        "Crypto Tracker",
        "Cryptocurrency prices, wallets and blockchain transactions.",
        [
            (
                "crypto-price",
                "Crypto price",
                "Price of Bitcoin, Ethereum and other coins.",
                ["crypto", "bitcoin", "blockchain"],
                ["What's the price of Bitcoin?", "How much is 2 ETH worth?"],
            ),
        ],
    ),
    "invoices": _card(
        "invoices",
        "Invoicing",
        "Creates and sends invoices, tracks payments and overdue bills.",
        [
            (
                "create-invoice",
                "Create invoice",
                "Invoice a customer for work or products.",
                ["billing", "invoices", "payments"],
                ["Send an invoice to Acme for 20 hours of work", "Which invoices are overdue?"],
            ),
        ],
    ),
    "tutor": _card(
        "tutor",
        "Math Tutor",
        "Explains math step by step: algebra, calculus, statistics and homework problems.",
        [
            (
                "solve",
                "Solve problem",
                "Solve and explain a math problem step by step.",
                ["education", "math"],
                ["Solve x^2 - 5x + 6 = 0", "Explain derivatives simply"],
            ),
        ],
    ),
    "security": _card(
        "security",
        "Security Scanner",
        "Scans websites and servers for vulnerabilities, open ports and TLS problems.",
        [
            (
                "scan",
                "Vulnerability scan",
                "Find known vulnerabilities and misconfigurations.",
                ["security", "vulnerabilities", "scanning"],
                ["Scan my website for vulnerabilities", "Is my TLS certificate set up right?"],
            ),
        ],
    ),
    "events": _card(
        "events",
        "Event Tickets",
        "Finds concerts, sports games and theater shows and buys tickets.",
        [
            (
                "find-events",
                "Find events",
                "Concerts, games and shows near you.",
                ["events", "tickets", "entertainment"],
                ["Concerts in London this weekend", "Buy two tickets for the Lakers game"],
            ),
        ],
    ),
    "car-rental": _card(
        "car-rental",
        "Car Rental",
        "Rents cars at airports and cities and compares rental prices.",
        [
            (
                "rent-car",
                "Rent a car",
                "Find and reserve a rental car.",
                ["travel", "car", "rental"],
                ["Rent an SUV at Denver airport", "Cheapest car hire in Lisbon for a week"],
            ),
        ],
    ),
}

#: (query, the agent a person asking it wants). Worded as people ask, not as the cards say.
QUERIES: list[tuple[str, str]] = [
    ("is it going to snow in Chicago this weekend", "weather"),
    ("I need a plane ticket from London to Madrid", "flights"),
    ("how much is 250 euros in Japanese yen", "currency"),
    ("look over my code changes before I merge them", "code-review"),
    ("put this email into Spanish", "translator"),
    ("somewhere to stay in Barcelona for two nights", "hotels"),
    ("set up a meeting with the design team next Monday", "calendar"),
    ("help me write an email asking for a deadline extension", "email"),
    ("what should I make for dinner with eggs and spinach", "recipes"),
    ("current share price of Microsoft", "stocks"),
    ("how much tax do I owe on my freelance income", "tax"),
    ("check this rental contract for anything unusual", "legal"),
    ("my package never arrived, where is my order", "support"),
    ("fastest route to the train station", "maps"),
    ("what happened in the news today", "news"),
    ("write a database query that counts orders per month", "sql"),
    ("make a picture of a dragon flying over mountains", "images"),
    ("convert this meeting recording to text", "transcribe"),
    ("give me a short summary of this long report", "summarizer"),
    ("a workout plan to get ready for a 10k run", "fitness"),
    ("my throat is sore and I have a fever", "doctor"),
    ("where can I buy a cheaper TV online", "shopping"),
    ("looking for data analyst job openings in Toronto", "jobs"),
    ("apartments to rent near the university", "realestate"),
    ("how much is one bitcoin worth right now", "crypto"),
    ("bill my client for last month's consulting", "invoices"),
    ("help me understand this algebra homework", "tutor"),
    ("check my server for security vulnerabilities", "security"),
    ("tickets for a jazz concert on Saturday", "events"),
    ("hire a car when I land in Rome", "car-rental"),
]
