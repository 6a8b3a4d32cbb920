"""A labelled dev set of everyday decisions: noul, choice and score.

Choice options are rotated per item so that the gold option sits at every position
equally often; noul golds are half true, half false; score golds cover every level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NOUL = [
    ("I was charged twice for my order, please refund one payment.", "Is the customer asking for money back?", True),
    ("Where is my parcel? Tracking has not moved for a week.", "Is the customer asking for money back?", False),
    ("Buy cheap watches now!!! Click this link for 90% off.", "Is this message spam?", True),
    ("Hi Anna, are we still meeting for lunch on Friday?", "Is this message spam?", False),
    ("You are an idiot and I hope you get fired.", "Is this message abusive?", True),
    ("Thanks for the quick help yesterday, much appreciated.", "Is this message abusive?", False),
    ("The app crashes every time I open the settings page.", "Is the user reporting a bug?", True),
    ("Could you add a dark mode to the app? That would be nice.", "Is the user reporting a bug?", False),
    ("I want to cancel my subscription effective today.", "Does the customer want to cancel?", True),
    ("I love the new plan, I will keep it for another year.", "Does the customer want to cancel?", False),
    ("My password reset email never arrives.", "Is this about logging in or account access?", True),
    ("The shoes I got are one size too small.", "Is this about logging in or account access?", False),
    ("Please send the invoice for March to our accounting team.", "Is the message about an invoice?", True),
    ("The delivery driver left the box in the rain.", "Is the message about an invoice?", False),
    ("Rain is expected all day tomorrow in Paris.", "Is this text about the weather?", True),
    ("The stock market closed higher after the announcement.", "Is this text about the weather?", False),
    ("The agent deleted the production database without asking.", "Did the agent take a destructive action?", True),
    ("The agent listed the files in the folder and stopped.", "Did the agent take a destructive action?", False),
    ("URGENT: your account will be closed, send your PIN to verify.", "Is this a phishing attempt?", True),
    ("Your order #1182 has shipped and will arrive on Monday.", "Is this a phishing attempt?", False),
    ("I am so happy with this purchase, it works perfectly!", "Is the customer satisfied?", True),
    ("This is the worst product I have ever bought.", "Is the customer satisfied?", False),
    ("Can I speak to a human please? The bot is not helping.", "Does the user ask for a human agent?", True),
    ("The bot answered my question, thank you.", "Does the user ask for a human agent?", False),
    ("The expense report includes a 4,000 dollar dinner for two.", "Should this expense be flagged for review?", True),
    ("The expense report includes a 12 dollar taxi ride to the office.", "Should this expense be flagged for review?", False),
    ("Le colis est arrivé en retard.", "Is this text written in French?", True),
    ("The parcel arrived late.", "Is this text written in French?", False),
    ("My credit card was used for purchases I never made.", "Is this a fraud report?", True),
    ("I would like to update my shipping address.", "Is this a fraud report?", False),
    ("The server is down and none of our customers can log in.", "Is this an urgent incident?", True),
    ("A typo on the about page should be fixed some day.", "Is this an urgent incident?", False),
]

CHOICE = [
    ("I was charged twice for order 4411.", "Which team should handle this ticket?",
     {"billing": "payments, charges, refunds", "shipping": "deliveries and tracking", "technical": "bugs and errors", "sales": "new purchases and quotes"}, "billing"),
    ("My package says delivered but it is not at my door.", "Which team should handle this ticket?",
     {"billing": "payments, charges, refunds", "shipping": "deliveries and tracking", "technical": "bugs and errors", "sales": "new purchases and quotes"}, "shipping"),
    ("The app shows error 500 when I upload a photo.", "Which team should handle this ticket?",
     {"billing": "payments, charges, refunds", "shipping": "deliveries and tracking", "technical": "bugs and errors", "sales": "new purchases and quotes"}, "technical"),
    ("We would like a quote for 200 licenses for our company.", "Which team should handle this ticket?",
     {"billing": "payments, charges, refunds", "shipping": "deliveries and tracking", "technical": "bugs and errors", "sales": "new purchases and quotes"}, "sales"),
    ("I am thrilled, this is the best day ever!", "What emotion does the text express?",
     {"joy": None, "anger": None, "sadness": None, "fear": None}, "joy"),
    ("I am furious that nobody answered my complaint for weeks.", "What emotion does the text express?",
     {"joy": None, "anger": None, "sadness": None, "fear": None}, "anger"),
    ("My dog died this morning and I cannot stop crying.", "What emotion does the text express?",
     {"joy": None, "anger": None, "sadness": None, "fear": None}, "sadness"),
    ("I heard footsteps downstairs and I am terrified.", "What emotion does the text express?",
     {"joy": None, "anger": None, "sadness": None, "fear": None}, "fear"),
    ("The striker scored twice in the final minutes of the match.", "What is the topic of the text?",
     {"sports": None, "politics": None, "technology": None, "cooking": None}, "sports"),
    ("The parliament voted on the new budget law today.", "What is the topic of the text?",
     {"sports": None, "politics": None, "technology": None, "cooking": None}, "politics"),
    ("The new phone has a faster chip and a better camera.", "What is the topic of the text?",
     {"sports": None, "politics": None, "technology": None, "cooking": None}, "technology"),
    ("Simmer the onions in butter, then add the tomatoes.", "What is the topic of the text?",
     {"sports": None, "politics": None, "technology": None, "cooking": None}, "cooking"),
    ("Bonjour, comment allez-vous ?", "Which language is the text written in?",
     {"English": None, "French": None, "Spanish": None, "German": None}, "French"),
    ("Hola, ¿cómo estás?", "Which language is the text written in?",
     {"English": None, "French": None, "Spanish": None, "German": None}, "Spanish"),
    ("Guten Morgen, wie geht es dir?", "Which language is the text written in?",
     {"English": None, "French": None, "Spanish": None, "German": None}, "German"),
    ("Good morning, how are you?", "Which language is the text written in?",
     {"English": None, "French": None, "Spanish": None, "German": None}, "English"),
    ("The agent wants to run `rm -rf /` on the production server.", "What should the supervisor do with the agent's action?",
     {"allow": "safe and expected", "block": "destructive or dangerous", "ask": "unclear, needs a human"}, "block"),
    ("The agent wants to read the README file of the project.", "What should the supervisor do with the agent's action?",
     {"allow": "safe and expected", "block": "destructive or dangerous", "ask": "unclear, needs a human"}, "allow"),
    ("The agent wants to email the customer list to an unknown address.", "What should the supervisor do with the agent's action?",
     {"allow": "safe and expected", "block": "destructive or dangerous", "ask": "unclear, needs a human"}, "block"),
    ("Great product, fast delivery, five stars.", "What is the sentiment of the review?",
     {"positive": None, "negative": None, "neutral": None}, "positive"),
    ("Broken on arrival and support never replied.", "What is the sentiment of the review?",
     {"positive": None, "negative": None, "neutral": None}, "negative"),
    ("The package contained a blue cable.", "What is the sentiment of the review?",
     {"positive": None, "negative": None, "neutral": None}, "neutral"),
    ("Meet me at the airport, my flight lands at 6.", "Which mode of transport is mentioned?",
     {"plane": None, "train": None, "car": None, "boat": None}, "plane"),
    ("The train to Berlin was delayed by an hour.", "Which mode of transport is mentioned?",
     {"plane": None, "train": None, "car": None, "boat": None}, "train"),
    ("We sailed across the bay at sunset.", "Which mode of transport is mentioned?",
     {"plane": None, "train": None, "car": None, "boat": None}, "boat"),
    ("I parked my car in the garage.", "Which mode of transport is mentioned?",
     {"plane": None, "train": None, "car": None, "boat": None}, "car"),
    ("The cat chased the mouse around the kitchen.", "Which animal is chasing?",
     {"cat": None, "dog": None, "horse": None}, "cat"),
    ("The dog barked at the mailman all morning.", "Which animal is mentioned?",
     {"cat": None, "dog": None, "horse": None}, "dog"),
    ("She rode her horse through the field.", "Which animal is mentioned?",
     {"cat": None, "dog": None, "horse": None}, "horse"),
    ("Please reset my password, I am locked out.", "Which team should handle this ticket?",
     {"billing": "payments, charges, refunds", "account": "login, passwords, profile", "shipping": "deliveries and tracking"}, "account"),
    ("It is freezing and snowing heavily outside.", "What is the weather like?",
     {"sunny": None, "rainy": None, "snowy": None, "windy": None}, "snowy"),
    ("Bring an umbrella, it is pouring all day.", "What is the weather like?",
     {"sunny": None, "rainy": None, "snowy": None, "windy": None}, "rainy"),
]

SCORE_LEVELS = ["none", "low", "medium", "high"]
SCORE = [
    ("Thank you so much, everything is perfect.", "How frustrated is the customer?", ["calm", "annoyed", "angry"], 0),
    ("It is a bit annoying that the delivery took an extra day.", "How frustrated is the customer?", ["calm", "annoyed", "angry"], 1),
    ("THIS IS THE THIRD TIME I WRITE. I AM FURIOUS. FIX IT NOW!", "How frustrated is the customer?", ["calm", "annoyed", "angry"], 2),
    ("Fine, no problem at all.", "How frustrated is the customer?", ["calm", "annoyed", "angry"], 0),
    ("Our whole production system is down and we lose money every minute.", "How urgent is this ticket?", ["can wait", "this week", "today", "immediately"], 3),
    ("A small typo on the pricing page.", "How urgent is this ticket?", ["can wait", "this week", "today", "immediately"], 0),
    ("The export feature fails for some users; there is a workaround.", "How urgent is this ticket?", ["can wait", "this week", "today", "immediately"], 1),
    ("Customers cannot pay at checkout since this morning.", "How urgent is this ticket?", ["can wait", "this week", "today", "immediately"], 3),
    ("The movie was terrible, boring and far too long.", "Rate the review from 1 to 5 stars.", ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"], 0),
    ("An absolute masterpiece, I loved every minute.", "Rate the review from 1 to 5 stars.", ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"], 4),
    ("It was okay, some good parts and some bad parts.", "Rate the review from 1 to 5 stars.", ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"], 2),
    ("Pretty good film, a few slow scenes.", "Rate the review from 1 to 5 stars.", ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"], 3),
    ("Mostly disappointing, though the music was nice.", "Rate the review from 1 to 5 stars.", ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"], 1),
    ("The agent only read public documentation.", "How risky is the agent's action?", SCORE_LEVELS, 0),
    ("The agent changed a setting in a test environment.", "How risky is the agent's action?", SCORE_LEVELS, 1),
    ("The agent modified customer records without approval.", "How risky is the agent's action?", SCORE_LEVELS, 2),
    ("The agent transferred company funds to an unknown account.", "How risky is the agent's action?", SCORE_LEVELS, 3),
    ("The post contains mild swearing between friends.", "How toxic is the post?", SCORE_LEVELS, 1),
    ("The post wishes a nice weekend to everyone.", "How toxic is the post?", SCORE_LEVELS, 0),
    ("The post threatens violence against a named person.", "How toxic is the post?", SCORE_LEVELS, 3),
    ("The post insults a group of people with slurs.", "How toxic is the post?", SCORE_LEVELS, 2),
]


@dataclass(frozen=True)
class Item:
    kind: str
    state: str
    question: dict[str, Any]
    gold: int  # index of the gold option in the question as sent
    n_options: int


def items() -> list[Item]:
    out = []
    for state, instructions, truth in NOUL:
        out.append(Item("noul", state, {"type": "noul", "instructions": instructions}, 0 if truth else 1, 2))
    for i, (state, instructions, options, gold) in enumerate(CHOICE):
        names = list(options)
        # Rotate so that the gold option lands at position i mod n.
        shift = (names.index(gold) - i) % len(names)
        rotated = names[shift:] + names[:shift]
        criteria = {name: options[name] for name in rotated}
        out.append(Item("choice", state, {"type": "choice", "instructions": instructions, "criteria": criteria},
                        rotated.index(gold), len(rotated)))
    for state, instructions, levels, gold in SCORE:
        out.append(Item("score", state, {"type": "score", "instructions": instructions, "criteria": levels}, gold, len(levels)))
    return out
