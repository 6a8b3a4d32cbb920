"""The labelled support-routing set the calibration tool is demonstrated on:
`python -m evals.support_routing` writes evals/support_routing.jsonl (committed).

160 tickets, 40 per queue, composed from templates with varied details, so that each
label is unambiguous to a person. Deterministic (seeded).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_suffix(".jsonl")
QUEUES = {
    "billing": [
        "I was charged twice for order {order}. Please refund the duplicate payment.",
        "My invoice for {month} shows the old price of {price}; I need a corrected invoice.",
        "Why did my card get billed {price} when my plan costs less? I want my money back.",
        "Please send me a receipt for the payment I made on {month} 3rd, my accountant needs it.",
        "The subscription renewed even though I cancelled it last week. Refund the {price} charge.",
        "Can I switch from monthly to yearly billing and get the discount applied to my next invoice?",
        "There is a charge of {price} on my statement that I do not recognise. What is it for?",
        "The VAT number on my invoice is wrong, please reissue invoice {order}.",
        "I paid by bank transfer for order {order} but the payment is still shown as outstanding.",
        "Your price went up without notice; I expect a credit for the difference on {month}'s bill.",
    ],
    "delivery": [
        "Order {order} was supposed to arrive on Monday and the tracking has not moved since.",
        "The parcel for order {order} arrived with a crushed box and the {item} inside is broken.",
        "I received the wrong {item} in my package, I ordered a different model.",
        "Can you change the shipping address for order {order}? I moved last week.",
        "The courier says they delivered my {item} but nothing was left at my door.",
        "How long does shipping to {city} usually take? My order {order} is still in transit.",
        "Only half of order {order} arrived; the second {item} is missing from the box.",
        "I would like to return the {item} I received yesterday, how do I get a return label?",
        "Tracking for {order} says 'held at customs' in {city}. What do I need to do?",
        "The delivery driver left my {item} in the rain and it is soaked.",
    ],
    "account": [
        "I cannot log in since the password policy changed; the reset email never arrives.",
        "Please delete my account and all the personal data you hold about me.",
        "How do I change the email address on my account to {name}@example.org?",
        "My account was locked after too many login attempts, can you unlock it?",
        "I want to add a second user, {name}, to our team account.",
        "Someone else seems to have logged into my account from {city}; please secure it.",
        "Two-factor authentication codes are not accepted anymore on my account.",
        "How can I download a copy of my profile data?",
        "I changed my phone number and can no longer receive the verification SMS for my account.",
        "Please merge my two accounts, I registered twice by mistake with {name}@example.org.",
    ],
    "technical": [
        "The mobile app crashes every time I open the settings screen on my {device}.",
        "Your API returns a 500 error when I upload files larger than 10 MB.",
        "The dashboard has been loading forever since this morning, on every browser I tried.",
        "Syncing between my {device} and the web app stopped working after the last update.",
        "Exporting a report to PDF produces an empty file.",
        "The app shows the error 'connection reset' when I try to save my work on {device}.",
        "Notifications stopped arriving on my {device} after I updated the app to version 4.2.",
        "Search returns no results even for items I know exist in my workspace.",
        "The integration with our calendar duplicates every event it imports.",
        "After the update the {device} app uses all the battery within an hour.",
    ],
}
FILL = {
    "order": [f"#{n}" for n in (4411, 5820, 7713, 9034, 1188, 6402, 3157, 8870)],
    "month": ["January", "March", "April", "June", "September", "November"],
    "price": ["$49", "$120", "EUR 35", "$9.99", "GBP 60"],
    "item": ["headphones", "coffee grinder", "desk lamp", "phone case", "keyboard", "backpack"],
    "city": ["Lyon", "Toronto", "Osaka", "Denver", "Porto", "Leeds"],
    "name": ["maria", "tom", "aisha", "li", "oskar", "nadia"],
    "device": ["iPhone", "Android tablet", "Pixel phone", "iPad", "Windows laptop"],
}
OPENERS = ["", "Hello, ", "Hi team, ", "Good morning. ", "Dear support, "]
CLOSERS = ["", " Thanks.", " Thank you for your help.", " This is urgent.", " Regards, a long-time customer."]


def tickets(per_queue: int = 40, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    items = []
    for queue, templates in QUEUES.items():
        for i in range(per_queue):
            text = templates[i % len(templates)]
            text = text.format(**{k: rng.choice(v) for k, v in FILL.items()})
            items.append({"state": f"{rng.choice(OPENERS)}{text}{rng.choice(CLOSERS)}".strip(), "expected": queue})
    rng.shuffle(items)
    return items


def main() -> None:
    items = tickets()
    OUT.write_text("".join(json.dumps(item) + "\n" for item in items))
    print(f"wrote {len(items)} labelled tickets to {OUT}")


if __name__ == "__main__":
    main()
