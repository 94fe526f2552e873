"""Templated prompt families with random content: math word problems, arithmetic, logic,
writing, extraction/rewriting/classification of a generated passage, roleplay, STEM and
humanities questions, everyday chat, and the follow-up turns of multi-turn conversations.

A template is a function of a `random.Random` that returns one user message; `FAMILIES` maps a
family to its templates and `FOLLOWUPS` a kind of first turn to the later turns that suit it.
The answers are never computed here: the target writes them. Written for this project from
scratch; no evaluation set (HumanEval, MT-Bench) was consulted or copied.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from . import prompt_words as W


@dataclass(frozen=True)
class Template:
    name: str  # "family.template", the unit the held-out split reserves
    make: Callable[[random.Random], str]


FAMILIES: dict[str, list[Template]] = {}


def _template(family: str):
    def register(fn):
        FAMILIES.setdefault(family, []).append(Template(f"{family}.{fn.__name__}", fn))
        return fn
    return register


def _names(r: random.Random, k: int) -> list[str]:
    return r.sample(W.NAMES, k)


def _a(word: str) -> str:
    return f"{'an' if word[0].lower() in 'aeiou' else 'a'} {word}"


# Content a format string may name; `fill` draws one of each it names.
SLOTS = {"audience": W.AUDIENCES, "topic": W.TOPICS, "language": W.LANGUAGES,
         "proglang": W.PROGRAMMING_LANGUAGES, "tone": tuple(_a(t) for t in W.TONES),
         "poem": tuple(_a(p) for p in W.POEM_FORMS), "job": tuple(_a(j) for j in W.JOBS)}


def fill(text: str, r: random.Random, **given) -> str:
    """``text`` with its {slots} filled: from ``given``, else drawn from SLOTS."""
    drawn = {k: r.choice(v) for k, v in SLOTS.items() if k not in given and "{" + k + "}" in text}
    return text.format(**given, **drawn)


def _money(x: float) -> str:
    return f"${x:,.2f}" if x != int(x) else f"${int(x):,}"


def _style(r: random.Random) -> str:
    """How an explanation should be given (often nothing said)."""
    return r.choice(["", "", "", "", " Use an analogy.", " Keep it under 100 words.",
                     " Give one concrete example.", " Answer in bullet points.",
                     " Explain it step by step.", " End with a one-sentence summary.",
                     " Use a table if it helps.", f" Write for {r.choice(W.AUDIENCES)}.",
                     " Be precise but brief.", " Mention one common mistake."])


def _ask(r: random.Random, question: str) -> str:
    """GSM8K-style questions come bare or with a request to show the work."""
    tail = r.choice(["", "", "", " Show your work.", " Explain your reasoning step by step.",
                     " Think step by step.", " Give the final answer at the end."])
    return question + tail


# ===================================================================== math word problems
@_template("math")
def shopping_change(r):
    a = r.choice(W.NAMES)
    i1, i2 = r.sample(W.FOODS, 2)
    n, m = r.randint(2, 9), r.randint(2, 9)
    p, q = r.choice([0.5, 0.75, 1.25, 1.5, 2, 2.5, 3, 4]), r.randint(1, 12)
    bill = next(b for b in (20, 50, 100, 200) if b > n * p + m * q)
    return _ask(r, f"{a} buys {n} {i1} at {_money(p)} each and {m} {i2} at {_money(q)} each. "
                   f"{a} pays with a {_money(bill)} bill. How much change does {a} get back?")


@_template("math")
def weekly_savings(r):
    a = r.choice(W.NAMES)
    s, w, f = r.randint(5, 60), r.randint(4, 30), r.choice([10, 20, 25, 30, 40, 50, 75])
    thing = r.choice(["bike", "guitar", "video game", "pair of shoes", "concert ticket",
                      "birthday present"])
    return _ask(r, f"{a} saves {_money(s)} every week. After {w} weeks, {a} spends {f}% of the "
                   f"savings on a {thing}. How much money does {a} have left?")


@_template("math")
def two_leg_trip(r):
    v1, h1, v2, h2 = r.randint(30, 120), r.randint(1, 5), r.randint(30, 120), r.randint(1, 5)
    vehicle = r.choice(["train", "car", "bus", "truck", "ferry"])
    return _ask(r, f"A {vehicle} travels at {v1} km/h for {h1} hours and then at {v2} km/h for "
                   f"{h2} hours. How far does it travel in total, and what is its average speed "
                   "for the whole trip?")


@_template("math")
def work_together(r):
    a, b = _names(r, 2)
    x, y = r.randint(2, 12), r.randint(2, 12)
    job = r.choice(["paint a fence", "clean the house", "mow the lawn", "pack the boxes",
                    "build a shed", "sort the library books"])
    return _ask(r, f"{a} can {job} in {x} hours, and {b} can do the same job in {y} hours. How "
                   f"long will it take them to {job} if they work together?")


@_template("math")
def ages(r):
    a, b = _names(r, 2)
    young, k, n = r.randint(3, 20), r.randint(2, 4), r.randint(2, 10)
    total = young + k * young + 2 * n
    return _ask(r, f"{a} is {k} times as old as {b}. In {n} years, the sum of their ages will be "
                   f"{total}. How old is {a} now?")


@_template("math")
def recipe_scaling(r):
    s, t = r.choice([2, 4, 6, 8]), r.choice([3, 5, 10, 12, 15, 20])
    flour, eggs = r.choice([1.5, 2, 2.5, 3]), r.randint(2, 4)
    dish = r.choice(["pancakes", "a cake", "bread rolls", "muffins", "a quiche"])
    return _ask(r, f"A recipe for {dish} that serves {s} people needs {flour} cups of flour and "
                   f"{eggs} eggs. How much flour and how many eggs are needed to serve {t} "
                   "people?")


@_template("math")
def heads_and_legs(r):
    c, g = r.randint(3, 40), r.randint(3, 40)
    two, four = r.choice([("chickens", "cows"), ("ducks", "sheep"), ("geese", "goats"),
                          ("ostriches", "horses")])
    return _ask(r, f"A farm has only {two} and {four}. Altogether the animals have {c + g} "
                   f"heads and {2 * c + 4 * g} legs. How many {two} and how many {four} are "
                   "there?")


@_template("math")
def discount_and_tax(r):
    item = r.choice(["jacket", "lamp", "bicycle", "laptop", "sofa", "pair of boots"])
    p, d, t = r.randint(20, 900), r.choice([10, 15, 20, 25, 30, 40]), r.choice([5, 7, 8, 10, 20])
    return _ask(r, f"A {item} costs {_money(p)}. It is on sale for {d}% off, and then a sales tax "
                   f"of {t}% is added to the sale price. What is the final price?")


@_template("math")
def ticket_sales(r):
    a = r.choice(W.NAMES)
    n, m, p = r.randint(10, 60), r.randint(1, 9), r.choice([2, 3, 4, 5, 6, 7.5])
    return _ask(r, f"{a}'s class sells {n} raffle tickets on Monday, twice as many on Tuesday, "
                   f"and {m} fewer than on Tuesday on Wednesday. Each ticket costs {_money(p)}. "
                   "How much money did the class raise over the three days?")


@_template("math")
def reading_days(r):
    a = r.choice(W.NAMES)
    pages, x, d, y = r.randint(150, 600), r.randint(10, 30), r.randint(2, 7), r.randint(20, 50)
    return _ask(r, f"{a} is reading a {pages}-page book. {a} reads {x} pages a day for {d} "
                   f"days and then {y} pages a day. How many days does it take {a} to finish "
                   "the book in total?")


@_template("math")
def leaky_tank(r):
    v, fill, leak = r.choice([200, 300, 450, 600, 1000]), r.randint(10, 40), r.randint(1, 9)
    return _ask(r, f"A tank holds {v} litres. A pipe fills it at {fill} litres per minute, but a "
                   f"leak drains {leak} litres per minute. Starting empty, how long does it take "
                   "to fill the tank?")


@_template("math")
def overtime_pay(r):
    a = r.choice(W.NAMES)
    w, h = r.choice([12, 15, 18, 20, 22.5, 25]), r.randint(41, 60)
    return _ask(r, f"{a} earns {_money(w)} per hour for the first 40 hours of a week and 1.5 "
                   f"times that rate for every hour beyond 40. Last week {a} worked {h} hours. "
                   f"How much did {a} earn?")


@_template("math")
def ratio_share(r):
    a, b, c = _names(r, 3)
    x, y, z = r.randint(1, 5), r.randint(1, 5), r.randint(1, 5)
    total = (x + y + z) * r.randint(3, 20)
    item = r.choice(W.FOODS)
    return _ask(r, f"{a}, {b} and {c} share {total} {item} in the ratio {x}:{y}:{z}. How many "
                   "does each of them get?")


@_template("math")
def target_average(r):
    a = r.choice(W.NAMES)
    scores = [r.randint(60, 98) for _ in range(r.randint(3, 5))]
    goal = min(95, round(sum(scores) / len(scores)) + r.randint(1, 6))
    return _ask(r, f"{a}'s test scores so far are {', '.join(map(str, scores))}. What score does "
                   f"{a} need on the next test to have an average of exactly {goal}?")


@_template("math")
def garden_path(r):
    l, w, p = r.randint(6, 30), r.randint(4, 20), r.choice([0.5, 1, 1.5, 2])
    return _ask(r, f"A rectangular garden is {l} m long and {w} m wide. A path {p} m wide runs "
                   "all the way around the outside of the garden. What is the area of the path?")


@_template("math")
def phone_plans(r):
    a, x = r.randint(10, 30), r.choice([1, 1.5, 2, 2.5, 3])
    b, y = a + r.randint(5, 20), r.choice([0.25, 0.5, 0.75])
    g = r.randint(5, 40)
    return _ask(r, f"Phone plan A costs {_money(a)} a month plus {_money(x)} per GB of data. "
                   f"Plan B costs {_money(b)} a month plus {_money(y)} per GB. For how many GB "
                   f"do the two plans cost the same, and which plan is cheaper for {g} GB?")


@_template("math")
def cookie_bags(r):
    a = r.choice(W.NAMES)
    n, m, g, k = r.randint(2, 6), r.choice([12, 18, 24, 30]), r.randint(3, 15), r.choice([4, 5, 6])
    return _ask(r, f"{a} bakes {n} batches of {m} cookies and gives {g} cookies to the "
                   f"neighbours. The rest are sold in bags of {k}. How many full bags can {a} "
                   "sell, and how many cookies are left over?")


@_template("math")
def compound_interest(r):
    p, rate = r.choice([500, 1000, 2500, 5000, 12000]), r.choice([2, 3, 4, 5, 6])
    t = r.randint(2, 8)
    return _ask(r, f"{_money(p)} is invested at {rate}% annual interest, compounded once a year. "
                   f"How much is the investment worth after {t} years, and how much of that is "
                   "interest?")


@_template("math")
def meeting_cyclists(r):
    a, b = _names(r, 2)
    v1, v2 = r.randint(10, 30), r.randint(10, 30)
    d = (v1 + v2) * r.choice([1, 1.5, 2, 2.5, 3])
    return _ask(r, f"{a} and {b} start cycling towards each other from two towns {d:g} km apart. "
                   f"{a} rides at {v1} km/h and {b} at {v2} km/h. After how long do they meet, "
                   f"and how far has {a} ridden by then?")


@_template("math")
def population_change(r):
    p, up, down = r.randint(20, 900) * 100, r.randint(2, 25), r.randint(2, 20)
    return _ask(r, f"A town has {p:,} residents. The population grows by {up}% in the first year "
                   f"and then shrinks by {down}% in the second year. How many residents does the "
                   "town have after two years?")


@_template("math")
def coin_jar(r):
    a = r.choice(W.NAMES)
    two, one, half = r.randint(2, 20), r.randint(2, 20), r.randint(2, 30)
    return _ask(r, f"{a}'s coin jar holds {two} two-euro coins, {one} one-euro coins and {half} "
                   "fifty-cent coins. How much money is in the jar?")


@_template("math")
def movie_end_time(r):
    h, m = r.randint(1, 10), r.choice([0, 10, 15, 20, 30, 40, 45, 50])
    ads, length = r.choice([10, 15, 20, 25]), r.randint(85, 175)
    return _ask(r, f"A film is scheduled to start at {h}:{m:02d} p.m. Before it, there are {ads} "
                   f"minutes of adverts, and the film itself lasts {length} minutes. At what time "
                   "does it end?")


@_template("math")
def fuel_cost(r):
    c, p, d = r.choice([4.5, 5, 6, 6.5, 7, 8]), r.choice([1.6, 1.75, 1.9, 2.1]), r.randint(80, 900)
    return _ask(r, f"A car uses {c} litres of fuel per 100 km and fuel costs {_money(p)} per "
                   f"litre. How much does the fuel for a {d} km round trip cost?")


@_template("math")
def boxes_needed(r):
    a = r.choice(W.NAMES)
    item = r.choice(W.FOODS)
    per, n = r.choice([6, 8, 12, 15, 20, 24]), r.randint(30, 400)
    return _ask(r, f"A box holds {per} {item}. {a} has {n} {item} to pack. How many boxes does "
                   f"{a} need, and how many empty spaces are left in the last box?")


@_template("math")
def shop_profit(r):
    item = r.choice(W.FOODS)
    n, c, k = r.randint(20, 200), r.choice([0.4, 0.8, 1.2, 2, 3.5]), r.randint(1, 15)
    s = round(c * r.choice([1.5, 1.8, 2, 2.5]), 2)
    return _ask(r, f"A shop buys {n} {item} for {_money(c)} each and sells them for {_money(s)} "
                   f"each. {k} of them are damaged and cannot be sold. If the shop sells all the "
                   "others, what is its profit?")


@_template("math")
def step_goal(r):
    a = r.choice(W.NAMES)
    per, goal, done = r.randint(90, 130), r.choice([8000, 10000, 12000]), r.randint(1500, 7000)
    return _ask(r, f"{a} takes about {per} steps per minute when walking. {a}'s daily goal is "
                   f"{goal:,} steps and {a} has already taken {done:,} steps today. How many more "
                   f"minutes does {a} need to walk?")


@_template("math")
def unit_price(r):
    g1, g2 = r.choice([250, 300, 375, 400, 500]), r.choice([600, 750, 800, 1000])
    p1, p2 = round(r.uniform(1.5, 4), 2), round(r.uniform(3, 8), 2)
    thing = r.choice(["cereal", "coffee", "rice", "pasta", "washing powder"])
    return _ask(r, f"A {g1} g pack of {thing} costs {_money(p1)} and a {g2} g pack costs "
                   f"{_money(p2)}. Which pack is the better deal, and by how much per 100 g?")


@_template("math")
def pizza_slices(r):
    k, p, s, e = r.randint(3, 9), r.randint(2, 6), r.choice([6, 8, 10, 12]), r.randint(1, 4)
    return _ask(r, f"{k} friends order {p} pizzas, each cut into {s} slices. Each friend eats "
                   f"{e} slices. How many slices are left, and what fraction of the pizza is "
                   "that?")


@_template("math")
def school_buses(r):
    c, s, pct, b = r.randint(6, 30), r.randint(18, 32), r.choice([40, 55, 60, 65, 75]), r.choice(
        [40, 48, 52, 60])
    return _ask(r, f"A school has {c} classes of {s} students. {pct}% of the students take the "
                   f"bus, and each bus holds {b} students. How many buses does the school need?")


@_template("math")
def marbles_given(r):
    a, b, c = _names(r, 3)
    k, m = r.choice([2, 3, 4, 5]), r.randint(2, 12)
    n = k * r.randint(5, 30)
    thing = r.choice(["marbles", "stickers", "stamps", "trading cards", "seashells"])
    return _ask(r, f"{a} had {n} {thing}. {a} gave 1/{k} of them to {b} and then {m} to {c}. "
                   f"How many {thing} does {a} have now?")


@_template("math")
def laps_week(r):
    a = r.choice(W.NAMES)
    x, y, z = r.randint(10, 30), r.randint(2, 10), r.randint(2, 3)
    sport = r.choice(["swims", "runs", "cycles"])
    unit = {"swims": "laps", "runs": "km", "cycles": "km"}[sport]
    return _ask(r, f"{a} {sport} {x} {unit} on Monday, {y} {unit} more on Tuesday than on "
                   f"Monday, and {z} times as many on Wednesday as on Tuesday. How many {unit} "
                   f"does {a} cover over the three days?")


@_template("math")
def salary_raise(r):
    a = r.choice(W.NAMES)
    s, up, bonus = r.randint(28, 95) * 1000, r.choice([3, 4, 5, 6, 8, 10]), r.randint(5, 30) * 100
    return _ask(r, f"{a} earns {_money(s)} a year and gets a {up}% raise, plus a one-time bonus "
                   f"of {_money(bonus)}. How much does {a} earn in the next year in total, and "
                   "what is the new monthly salary without the bonus?")


@_template("math")
def water_usage(r):
    people, shower, mins = r.randint(2, 6), r.choice([8, 9, 10, 12]), r.randint(5, 15)
    return _ask(r, f"A family of {people} each take one {mins}-minute shower a day. The shower "
                   f"uses {shower} litres of water per minute. How much water do the showers use "
                   "in a 30-day month? If each shower were 3 minutes shorter, how much would they "
                   "save?")


# ===================================================================== arithmetic & units
UNITS = [("kilometres", "miles", 0.621371), ("miles", "kilometres", 1.60934),
         ("kilograms", "pounds", 2.20462), ("pounds", "kilograms", 0.453592),
         ("litres", "US gallons", 0.264172), ("inches", "centimetres", 2.54),
         ("feet", "metres", 0.3048), ("metres per second", "kilometres per hour", 3.6),
         ("ounces", "grams", 28.3495), ("hours", "seconds", 3600), ("square metres",
                                                                    "square feet", 10.7639),
         ("cups", "millilitres", 240), ("acres", "hectares", 0.404686)]


@_template("arithmetic")
def multiply(r):
    a, b = r.randint(12, 9999), r.randint(11, 999)
    return r.choice([f"What is {a} times {b}?", f"Calculate {a} x {b}.", f"Compute {a} * {b} "
                     "and show the steps of the multiplication."])


@_template("arithmetic")
def long_division(r):
    b = r.randint(3, 97)
    a = b * r.randint(10, 999) + r.randint(0, b - 1)
    return f"Divide {a} by {b}. What are the quotient and the remainder?"


@_template("arithmetic")
def expression(r):
    x = [r.randint(2, 50) for _ in range(5)]
    ops = r.choice(["({0} + {1}) * {2} - {3} / {4}", "{0} * {1} - {2} * ({3} - {4})",
                    "{0} + {1} * {2} - ({3} + {4})", "({0} - {1}) * ({2} + {3}) / {4}",
                    "{0}^2 - {1} * {2} + {3}"])
    return f"Evaluate {ops.format(*x)}, following the order of operations."


@_template("arithmetic")
def percent_of(r):
    p, n = r.choice([5, 12.5, 15, 18, 20, 35, 40, 62, 75, 120]), r.randint(20, 5000)
    return r.choice([f"What is {p}% of {n}?", f"{n} is increased by {p}%. What is the result?",
                     f"A price drops from {n} to {round(n * (1 - min(p, 90) / 100))}. What is "
                     "the percentage decrease?"])


@_template("arithmetic")
def fractions(r):
    a, b, c, d = r.randint(1, 9), r.randint(2, 12), r.randint(1, 9), r.randint(2, 12)
    op = r.choice(["+", "-", "x", "divided by"])
    return f"Compute {a}/{b} {op} {c}/{d} and simplify the result to lowest terms."


@_template("arithmetic")
def convert_units(r):
    src, dst, _ = r.choice(UNITS)
    v = r.choice([r.randint(1, 500), round(r.uniform(0.5, 100), 1)])
    return r.choice([f"Convert {v} {src} to {dst}.", f"How many {dst} are in {v} {src}?",
                     f"I have {v} {src}. What is that in {dst}? Explain the conversion."])


@_template("arithmetic")
def temperature(r):
    if r.random() < 0.5:
        return f"Convert {r.randint(-30, 45)} degrees Celsius to Fahrenheit."
    return f"What is {r.randint(-20, 110)} degrees Fahrenheit in Celsius?"


@_template("arithmetic")
def linear_equation(r):
    a, x, b = r.randint(2, 15), r.randint(-20, 20), r.randint(-50, 50)
    c = a * x + b
    return f"Solve for x: {a}x {'+' if b >= 0 else '-'} {abs(b)} = {c}."


@_template("arithmetic")
def linear_system(r):
    x, y = r.randint(-9, 9), r.randint(-9, 9)
    a, b, c, d = r.randint(1, 6), r.randint(1, 6), r.randint(1, 6), -r.randint(1, 6)
    return (f"Solve the system of equations: {a}x + {b}y = {a * x + b * y} and "
            f"{c}x - {-d}y = {c * x + d * y}.")


@_template("arithmetic")
def quadratic(r):
    p, q = r.randint(-9, 9), r.randint(-9, 9)
    b, c = -(p + q), p * q
    return (f"Find the roots of x^2 {'+' if b >= 0 else '-'} {abs(b)}x "
            f"{'+' if c >= 0 else '-'} {abs(c)} = 0.")


@_template("arithmetic")
def gcd_lcm(r):
    g = r.randint(2, 24)
    a, b = g * r.randint(2, 20), g * r.randint(2, 20)
    return r.choice([f"What is the greatest common divisor of {a} and {b}?",
                     f"Find the least common multiple of {a} and {b}.",
                     f"Find the GCD and LCM of {a} and {b} using the Euclidean algorithm."])


@_template("arithmetic")
def primality(r):
    n = r.randint(50, 5000) | 1
    return r.choice([f"Is {n} a prime number? Explain how you checked.",
                     f"What is the prime factorisation of {n + 1}?"])


@_template("arithmetic")
def statistics(r):
    xs = [r.randint(1, 60) for _ in range(r.randint(5, 9))]
    return f"Find the mean, median and mode of these numbers: {', '.join(map(str, xs))}."


@_template("arithmetic")
def bases(r):
    n = r.randint(5, 4000)
    return r.choice([f"Convert the decimal number {n} to binary.",
                     f"What is {n} in hexadecimal?", f"Convert the binary number {n:b} to "
                     "decimal.", f"Convert 0x{n:X} to decimal."])


@_template("arithmetic")
def powers_roots(r):
    return r.choice([f"What is {r.randint(2, 12)} to the power of {r.randint(2, 6)}?",
                     f"What is the square root of {r.randint(2, 40) ** 2}?",
                     f"Estimate the square root of {r.randint(10, 999)} to two decimal places.",
                     f"Simplify the square root of {r.choice([8, 12, 18, 20, 27, 45, 50, 72])}."])


@_template("arithmetic")
def sci_notation(r):
    n = r.randint(1, 999) * 10 ** r.randint(3, 11)
    return r.choice([f"Write {n:,} in scientific notation.",
                     f"Round {r.uniform(0, 1000):.5f} to three significant figures."])


@_template("arithmetic")
def geometry(r):
    a, b = r.randint(2, 30), r.randint(2, 30)
    return r.choice([f"What is the area of a circle with radius {a} cm?",
                     f"A right triangle has legs of {a} and {b}. How long is the hypotenuse?",
                     f"What is the volume of a box that is {a} cm by {b} cm by {r.randint(2, 20)}"
                     " cm?", f"A rectangle has a perimeter of {2 * (a + b)} m and one side of "
                     f"{a} m. What is its area?", f"What is the sum of the interior angles of a "
                     f"polygon with {r.randint(5, 12)} sides?"])


# ===================================================================== logic and reasoning
_CATS = {"animals": ["dog", "eagle", "salmon", "frog", "horse", "owl"],
         "fruits": ["apple", "mango", "cherry", "pear", "plum", "kiwi"],
         "instruments": ["violin", "drum", "flute", "piano", "trumpet", "harp"],
         "metals": ["iron", "copper", "gold", "zinc", "silver", "tin"],
         "vehicles": ["tram", "scooter", "canoe", "lorry", "glider", "tractor"]}
_GROUPS = ["cats", "painters", "engineers", "birds", "musicians", "runners", "teachers",
           "robots", "poets", "gardeners", "students", "doctors", "chess players", "sailors"]


@_template("logic")
def ordering(r):
    people = _names(r, r.randint(3, 5))
    rel = r.choice([("taller than", "shortest", "tallest"), ("older than", "youngest", "oldest"),
                    ("faster than", "slowest", "fastest"), ("richer than", "poorest", "richest")])
    facts = [f"{a} is {rel[0]} {b}" for a, b in zip(people, people[1:])]
    r.shuffle(facts)
    q = r.choice([f"Who is the {rel[1]}?", f"Who is the {rel[2]}?",
                  f"Is {people[-1]} {rel[0]} {people[0]}?", "List everyone in order."])
    return f"{'. '.join(facts)}. {q} Explain your reasoning."


@_template("logic")
def syllogism(r):
    x, y, z = r.sample(_GROUPS, 3)
    form = r.choice([(f"All {x} are {y}. All {y} are {z}.", f"Are all {x} {z}?"),
                     (f"All {x} are {y}. Some {y} are {z}.", f"Does it follow that some {x} are "
                      f"{z}?"),
                     (f"No {x} are {y}. Some {z} are {x}.", f"Can we conclude that some {z} are "
                      f"not {y}?"),
                     (f"Some {x} are {y}. No {y} are {z}.", f"Is it true that no {x} are {z}?")])
    return f"{form[0]} {form[1]} Is the argument valid? Explain."


@_template("logic")
def sequence(r):
    kind = r.randrange(5)
    a, d = r.randint(1, 20), r.randint(2, 9)
    if kind == 0:
        xs = [a + d * i for i in range(5)]
    elif kind == 1:
        xs = [a * d ** i for i in range(5)]
    elif kind == 2:
        xs = [(a + i) ** 2 for i in range(5)]
    elif kind == 3:
        xs = [a, d]
        for _ in range(4):
            xs.append(xs[-1] + xs[-2])
    else:
        xs = [a + i * (i + 1) // 2 * d for i in range(5)]
    return (f"What number comes next in the sequence {', '.join(map(str, xs))}, ...? "
            "Explain the rule.")


@_template("logic")
def knights_knaves(r):
    a, b = _names(r, 2)
    says = r.choice([(f'{a} says: "{b} is a knave."', f'{b} says: "{a} and I are both knights."'),
                     (f'{a} says: "At least one of us is a knave."', ""),
                     (f'{a} says: "We are the same kind."', f'{b} says: "We are different '
                      'kinds."'),
                     (f'{a} says: "{b} would say that I am a knave."', "")])
    return ("On an island, knights always tell the truth and knaves always lie. You meet "
            f"{a} and {b}. {' '.join(s for s in says if s)} What are {a} and {b}?")


@_template("logic")
def family_relations(r):
    a, b, c = _names(r, 3)
    rel = r.choice([(f"{a} is {b}'s mother. {c} is {a}'s brother.", f"How is {c} related to "
                     f"{b}?"),
                    (f"{a} is the son of {b}. {b} is the daughter of {c}.", f"What is {c} to "
                     f"{a}?"),
                    (f"{a}'s father is {b}'s only son. {b} has no daughters.", f"How is {b} "
                     f"related to {a}?"),
                    (f"{a} and {b} are siblings. {c} is {b}'s daughter.", f"What is {a} to "
                     f"{c}?")])
    return " ".join(rel)


@_template("logic")
def modus_tollens(r):
    p = r.choice(["it rains", "the alarm rings", "the shop is open", "the train is late",
                  "the battery is charged", "the team wins"])
    q = r.choice(["the picnic is cancelled", "everyone leaves the building", "the lights are on",
                  "the meeting is moved", "the robot moves", "there is a parade"])
    fact = r.choice([f"{q[0].upper() + q[1:]} did not happen.", f"{p[0].upper() + p[1:]}.",
                     f"{q[0].upper() + q[1:]}."])
    return f'Consider the rule: "If {p}, then {q}." {fact} What can we conclude, if anything?'


@_template("logic")
def counting(r):
    n = r.randint(4, 12)
    word = r.choice(["LEVEL", "BANANA", "SPEED", "ORANGE", "PUZZLE", "MATH", "LETTER", "BALLOON"])
    return r.choice([f"How many handshakes happen if {n} people each shake hands with everyone "
                     "else exactly once?", f"In how many different ways can the letters of the "
                     f"word {word} be arranged?", f"How many ways can a committee of "
                     f"{r.randint(2, 4)} be chosen from {n} people?",
                     f"You roll two dice. What is the probability that the sum is "
                     f"{r.randint(2, 12)}?"])


@_template("logic")
def price_puzzle(r):
    i1, i2 = r.sample(["notebook", "pen", "mug", "ball", "hat", "kite", "apple", "ruler"], 2)
    cheap, diff = r.randint(1, 40) * 5, r.randint(1, 40) * 5
    return (f"A {i1} and a {i2} cost {diff + 2 * cheap} cents together. The {i1} costs {diff} "
            f"cents more than the {i2}. How much does the {i2} cost? Be careful.")


@_template("logic")
def weekday_arith(r):
    day, n = r.choice(W.WEEKDAYS), r.randint(3, 400)
    return r.choice([f"If today is {day}, what day of the week will it be in {n} days?",
                     f"If the day after tomorrow is {day}, what day was it {n} days ago?"])


@_template("logic")
def clock_angle(r):
    h, m = r.randint(1, 12), r.choice(range(0, 60, 5))
    return f"What is the smaller angle between the hour and minute hands of a clock at {h}:{m:02d}?"


@_template("logic")
def water_jugs(r):
    a, b = r.choice([(3, 5), (4, 7), (5, 8), (3, 7), (4, 9), (6, 11)])
    c = r.choice([x for x in range(1, b) if x not in (a,)])
    return (f"You have a {a}-litre jug and a {b}-litre jug, and unlimited water. How can you "
            f"measure exactly {c} litres? List the steps.")


@_template("logic")
def odd_one_out(r):
    c1, c2 = r.sample(list(_CATS), 2)
    words = r.sample(_CATS[c1], 3) + [r.choice(_CATS[c2])]
    r.shuffle(words)
    return f"Which word does not belong with the others: {', '.join(words)}? Why?"


@_template("logic")
def who_owns(r):
    people = _names(r, 3)
    pets = r.sample(["cat", "dog", "parrot", "fish", "rabbit", "turtle"], 3)
    colours = r.sample(list(W.COLOURS), 3)
    clues = [f"{people[0]} does not own the {pets[1]}", f"the person in the {colours[2]} house "
             f"owns the {pets[2]}", f"{people[1]} lives in the {colours[1]} house",
             f"{people[0]} does not live in the {colours[2]} house",
             f"the {pets[0]} does not live in the {colours[1]} house"]
    r.shuffle(clues)
    return (f"{', '.join(people)} each live in a different house ({', '.join(colours)}) and own "
            f"a different pet ({', '.join(pets)}). Clues: {'; '.join(clues)}. Who owns the "
            f"{r.choice(pets)}?")


@_template("logic")
def reasoning_estimate(r):
    thing = r.choice(["tennis balls", "grains of rice", "books", "footballs", "sugar cubes",
                      "marbles", "ping-pong balls", "bricks", "smartphones", "apples",
                      "coins", "paper clips"])
    place = r.choice(["a school bus", "a one-kilogram bag", "a city library", "a bathtub",
                      "an Olympic swimming pool", "a shipping container", "a classroom",
                      "a suitcase", "a cathedral", "a lift", "a football stadium"])
    return r.choice([f"Roughly how many {thing} would fit in {place}? Explain your estimate "
                     "step by step.", f"Estimate how many {thing} it would take to fill {place}."
                     " State your assumptions."])


# ===================================================================== writing
def _length(r):
    return r.choice(["", "", " Keep it under 150 words.", " Use about 300 words.",
                     " Make it three paragraphs long.", " Keep it short.", ""])


@_template("writing")
def email(r):
    return (f"Write {_a(r.choice(W.TONES))} email to {r.choice(W.RECIPIENTS)} to "
            f"{r.choice(W.EMAIL_PURPOSES)}.{_length(r)}")


@_template("writing")
def story(r):
    who = f"{_a(r.choice(W.JOBS))} named {r.choice(W.NAMES)}"
    twist = r.choice(["", " End with a twist.", " Tell it in the first person.",
                      " Start with a line of dialogue.", " Include a mysterious letter.",
                      " It must take place in a single hour."])
    return (f"Write a short {r.choice(W.GENRES)} story about {who} and {r.choice(W.TOPICS)}."
            f"{twist}{_length(r)}")


@_template("writing")
def poem(r):
    return r.choice([f"Write {_a(r.choice(W.POEM_FORMS))} about {r.choice(W.TOPICS)}.",
                     f"Compose {_a(r.choice(W.POEM_FORMS))} in {_a(r.choice(W.TONES))} tone about "
                     f"{r.choice(W.TOPICS)}.", f"Write a poem about {r.choice(W.PLACES)} for "
                     f"{r.choice(W.AUDIENCES)}."])


@_template("writing")
def essay(r):
    return r.choice([f"Write a persuasive essay arguing that {r.choice(W.TOPICS)} matters more "
                     "than people think.", f"Write an essay on {r.choice(W.TOPICS)}.",
                     f"Write an opinion piece about {r.choice(W.TOPICS)} for a local newspaper."
                     ]) + _length(r)


@_template("writing")
def blog_post(r):
    place = r.choice(W.PLACES)
    return r.choice([f"Write a blog post about a week spent in {place}, with tips for "
                     f"{r.choice(W.TRIP_KINDS)}.", f"Write a blog post titled "
                     f'"What {r.choice(W.TOPICS)} taught me".', f"Write a lively blog post "
                     f"reviewing {r.choice(W.PRODUCTS)}."]) + _length(r)


@_template("writing")
def product_copy(r):
    return (f"Write a product description for {r.choice(W.PRODUCTS)} aimed at "
            f"{r.choice(W.AUDIENCES)}. Highlight {', '.join(r.sample(W.PRODUCT_ASPECTS, 2))}.")


@_template("writing")
def speech(r):
    occasion = r.choice(["a wedding", "a graduation ceremony", "a retirement party",
                         "the opening of a community garden", "a team kickoff meeting",
                         "a school sports day", "a charity dinner", "a farewell party"])
    return f"Write {_a(r.choice(W.TONES))} speech for {occasion}.{_length(r)}"


@_template("writing")
def dialogue(r):
    a, b = _names(r, 2)
    return (f"Write a dialogue between {a}, {_a(r.choice(W.JOBS))}, and {b}, a "
            f"{r.choice(W.JOBS)}, who meet by chance and talk about {r.choice(W.TOPICS)}.")


@_template("writing")
def letter(r):
    return r.choice([f"Write a letter to your future self about {r.choice(W.TOPICS)}.",
                     f"Write a cover letter for a job as {_a(r.choice(W.JOBS))} at "
                     f"{r.choice(W.COMPANIES)}.", f"Write a thank-you note to a "
                     f"{r.choice(W.JOBS)} who helped you.", f"Write a letter to the mayor of "
                     f"{r.choice(W.PLACES)} proposing an idea to improve the city."])


@_template("writing")
def short_forms(r):
    return r.choice([f"Write five slogans for {r.choice(W.COMPANIES)}, a company that sells "
                     f"{r.choice(W.PRODUCTS)}.", f"Write a social media post announcing "
                     f"{r.choice(W.PRODUCTS)}.", f"Write a diary entry about "
                     f"{r.choice(W.TOPICS)}.", f"Write song lyrics about {r.choice(W.TOPICS)}.",
                     f"Write a riddle whose answer is {_a(r.choice(W.JOBS))}.",
                     f"Write a limerick about {_a(r.choice(W.JOBS))} from {r.choice(W.PLACES)}."])


@_template("writing")
def outline(r):
    return r.choice([f"Create an outline for a presentation about {r.choice(W.TOPICS)}.",
                     f"Write the opening paragraph of a novel about {r.choice(W.TOPICS)}.",
                     f"Write a scene description for a film set in {r.choice(W.PLACES)}.",
                     f"Draft a short newsletter for {r.choice(W.COMPANIES)} about this month's "
                     "news."])


# ===================================================================== extraction / rewriting
def _review(r):
    product, a1, a2 = r.choice(W.PRODUCTS), *r.sample(W.PRODUCT_ASPECTS, 2)
    name, stars = r.choice(W.NAMES), r.randint(1, 5)
    return (f"Review by {name} ({stars}/5 stars): I bought {product} from "
            f"{r.choice(W.COMPANIES)} in {r.choice(W.MONTHS)}. The {a1} is "
            f"{r.choice(W.ADJECTIVES)}, but the {a2} is {r.choice(W.ADJECTIVES)}. "
            + r.choice(["I would buy it again.", "I returned it after a week.", "It does the job.",
                        "My family loves it.", "Not worth the money."]))


def _news(r):
    place, event, name, job = r.choice(W.PLACES), r.choice(W.EVENTS), r.choice(W.NAMES), r.choice(
        W.JOBS)
    day, month, year = r.randint(1, 28), r.choice(W.MONTHS), r.randint(2015, 2025)
    n = r.randint(120, 90000)
    return (f"{place}, {month} {day}, {year} - The city {event}. About {n:,} people are expected "
            f"to benefit, officials said. \"This is a big step for everyone here,\" said {name}, "
            f"a local {job}. The project cost {_money(r.randint(1, 90) * 100000)} and will be "
            f"reviewed again in {r.choice(W.MONTHS)}.")


def _meeting(r):
    people = _names(r, 3)
    tasks = r.sample(["update the budget", "call the supplier", "book the venue",
                      "write the release notes", "fix the login bug", "draft the newsletter",
                      "review the contract", "order new laptops"], 3)
    days = r.sample(W.WEEKDAYS[:5], 3)
    lines = [f"- {p} will {t} by {d}." for p, t, d in zip(people, tasks, days)]
    return f"Meeting notes ({r.choice(W.COMPANIES)}):\n" + "\n".join(lines) + (
        f"\n- Next meeting: {r.choice(W.WEEKDAYS[:5])} at {r.randint(9, 16)}:00.")


def _records(r):
    rows = []
    for name in _names(r, r.randint(3, 6)):
        dept = r.choice(["Sales", "Research", "Support", "Finance"])
        rows.append(f"{name}, {r.randint(22, 64)}, {dept}, {r.randint(35, 140) * 1000}")
    return "name, age, department, salary\n" + "\n".join(rows)


_PASSAGES = (_review, _news, _meeting, _records)
_PASSAGE_TASKS = {
    _review: ["Extract the product, the rating and the pros and cons as JSON.",
              "Is this review positive, negative or mixed? Answer with one word and a reason.",
              "Summarise this review in one sentence.",
              "Write a polite reply from the company to this review."],
    _news: ["Extract every person, place, date and amount of money mentioned, as a list.",
            "Write a headline for this article.", "Summarise the article in one sentence.",
            "Rewrite the article for a children's newspaper.",
            "What questions would a journalist still need to answer?"],
    _meeting: ["List the action items as a table with owner, task and deadline.",
               "Write a follow-up email to the team based on these notes.",
               "Who has the earliest deadline, and what is it?",
               "Convert these notes into JSON."],
    _records: ["Convert this data into a markdown table.", "Who earns the most, and how much?",
               "Compute the average salary per department.",
               "Return the rows as a JSON list of objects.",
               "Sort the people by age and list their names."],
}


@_template("extraction")
def passage_task(r):
    make = r.choice(_PASSAGES)
    return f"{r.choice(_PASSAGE_TASKS[make])}\n\n{make(r)}"


@_template("extraction")
def passage_first(r):
    make = r.choice(_PASSAGES)
    return f"Read the following text.\n\n{make(r)}\n\n{r.choice(_PASSAGE_TASKS[make])}"


@_template("extraction")
def rewrite(r):
    text = r.choice(_PASSAGES[:2])(r)
    how = r.choice([f"in {_a(r.choice(W.TONES))} tone", f"for {r.choice(W.AUDIENCES)}",
                    "in half as many words", "as a bulleted list", "in the passive voice",
                    f"in {r.choice(W.LANGUAGES)}", "without changing its meaning but more clearly"])
    return f"Rewrite the following text {how}:\n\n{text}"


_ERRORS = [("their", "there"), ("is", "are"), ("went", "goed"), ("a ", "an "), ("its", "it's"),
           ("than", "then"), ("were", "was"), ("bought", "buyed")]


@_template("extraction")
def fix_grammar(r):
    a, b = _names(r, 2)
    base = r.choice([f"{a} and {b} were late because their bus broke down, so they bought a "
                     "taxi ride and went home.", f"The team is better than it was last year, and "
                     f"its coach, {a}, is proud.", f"{a} bought a new {r.choice(W.PRODUCTS)[2:]} "
                     f"and {b} went to a shop to return theirs."])
    for good, bad in r.sample(_ERRORS, 3):
        base = base.replace(good, bad, 1)
    return f"Correct the grammar and spelling in this sentence: \"{base}\""


@_template("extraction")
def classify_items(r):
    words = [w for c in r.sample(list(_CATS), 3) for w in r.sample(_CATS[c], 3)]
    r.shuffle(words)
    return f"Group these words into categories and name each category: {', '.join(words)}."


@_template("extraction")
def fact_or_opinion(r):
    facts = [f"{r.choice(W.PLACES)} is a real place.", "Water boils at 100 degrees Celsius at sea "
             "level.", f"{r.choice(W.MONTHS)} has at least 28 days.", "The Earth orbits the Sun."]
    opinions = [f"{r.choice(W.PLACES)} is the most beautiful place in the world.",
                f"Being {_a(r.choice(W.JOBS))} is the best job there is.",
                f"{r.choice(W.GENRES).capitalize()} is the most boring genre.",
                "Mornings are better than evenings."]
    items = r.sample(facts, 2) + r.sample(opinions, 2)
    r.shuffle(items)
    return "Label each statement as fact or opinion:\n" + "\n".join(
        f"{i + 1}. {s}" for i, s in enumerate(items))


@_template("extraction")
def normalise_dates(r):
    d = [f"{r.randint(1, 28)} {r.choice(W.MONTHS)} {r.randint(1990, 2030)}",
         f"{r.randint(1, 12)}/{r.randint(1, 28)}/{r.randint(1990, 2030)}",
         f"{r.choice(W.MONTHS)} {r.randint(1, 28)}, {r.randint(1990, 2030)}",
         f"{r.randint(1990, 2030)}.{r.randint(1, 12):02d}.{r.randint(1, 28):02d}"]
    r.shuffle(d)
    return ("Convert every date in this text to the format YYYY-MM-DD: "
            f"The contract was signed on {d[0]}, amended on {d[1]}, renewed on {d[2]} and ends "
            f"on {d[3]}.")


# ===================================================================== roleplay
@_template("roleplay")
def role_request(r):
    return r.choice([f"Pretend you are {r.choice(W.ROLES)}. {r.choice(W.ROLE_REQUESTS)}",
                     f"Act as {r.choice(W.ROLES)}. Stay in character. "
                     f"{r.choice(W.ROLE_REQUESTS)}",
                     f"You are {r.choice(W.ROLES)} in {r.choice(W.PLACES)}. "
                     f"{r.choice(W.ROLE_REQUESTS)}"])


@_template("roleplay")
def role_interview(r):
    return (f"I want to practise. Play the role of {r.choice(W.ROLES)} and ask me questions one "
            f"at a time about {r.choice(W.TOPICS)}. Start now.")


@_template("roleplay")
def role_explain(r):
    return (f"Imagine you are {r.choice(W.ROLES)}. Explain "
            f"{r.choice(r.choice(list(W.STEM.values())))} in your own style.")


@_template("roleplay")
def role_scene(r):
    a = r.choice(W.NAMES)
    return (f"Let's play a game. You are {r.choice(W.ROLES)} and I am {a}, a "
            f"{r.choice(W.JOBS)} who has just walked in. Greet me and tell me what happens next.")


@_template("roleplay")
def role_letter(r):
    return (f"In the voice of {r.choice(W.ROLES)}, write a short letter to {r.choice(W.NAMES)} "
            f"about {r.choice(W.TOPICS)}.")


@_template("roleplay")
def role_advice(r):
    return (f"You are {r.choice(W.ROLES)}. A visitor asks you how to {r.choice(W.HOWTO_TASKS)}. "
            "Answer in character.")


# ===================================================================== STEM and humanities
def _one(table):
    def pick(r):
        field = r.choice(list(table))
        return {"field": field, "x": r.choice(table[field])}
    return pick


def _two(table):
    def pick(r):
        field = r.choice(list(table))
        x, y = r.sample(table[field], 2)
        return {"field": field, "x": x, "y": y}
    return pick


def _phrasings(family: str, name: str, pick, phrasings: tuple[str, ...]) -> None:
    """Registers a template: one of ``phrasings`` filled with ``pick(r)``'s content (and any
    SLOTS it names), plus a style request."""
    def make(r):
        return fill(r.choice(phrasings), r, **pick(r)) + _style(r)
    make.__name__ = name
    FAMILIES.setdefault(family, []).append(Template(f"{family}.{name}", make))


_STEM_TEMPLATES = {
    "stem_explain": (_one, ("Explain {x} in simple terms.",
                            "What is {x}, and why does it matter in {field}?",
                            "Explain {x} to {audience}.", "How does {x} work? Give an example.")),
    "stem_compare": (_two, ("Compare {x} and {y}.", "What is the connection between {x} and {y}?",
                            "In {field}, how do {x} and {y} differ?")),
    "stem_apply": (_one, ("Give three real-world applications of {x}.",
                          "What are common misconceptions about {x}?",
                          "Design a simple experiment or example that demonstrates {x}.",
                          "Write a five-question quiz about {x}, with answers.",
                          "Summarise the history of how {x} was discovered or developed.")),
    "stem_problem": (_one, ("I am studying {field}. What are the key equations or rules behind "
                            "{x}, and what does each term mean?",
                            "What would happen if {x} did not exist or stopped working?",
                            "Write a short worked example that uses {x}.")),
    "stem_history": (_one, ("Who discovered or developed {x}, and how?",
                            "How has our understanding of {x} changed over time?",
                            "Tell the story of {x} as if it were an adventure.")),
    "stem_teach": (_one, ("Create a one-page study guide on {x}.",
                          "List five facts about {x} that surprise most people.",
                          "Explain {x} using an analogy from cooking or sport.")),
}
_HUMANITIES_TEMPLATES = {
    "hum_explain": (_one, ("Explain {x} and why it matters.", "What are the main ideas of {x}?",
                           "Summarise {x} for {audience}.",
                           "What should everyone know about {x}?")),
    "hum_discuss": (_one, ("Discuss the causes and consequences of {x}.",
                           "How did {x} shape the modern world?",
                           "What are the strongest arguments for and against {x}?",
                           "Write a short essay about {x}.")),
    "hum_compare": (_two, ("Compare {x} and {y}.",
                           "What do {x} and {y} have in common, and how do they differ?")),
    "hum_apply": (_one, ("How could {x} help us understand {topic}?",
                         "Give a modern example that illustrates {x}.",
                         "Design a lesson plan for teaching {x} to {audience}.")),
    "hum_perspective": (_one, ("How would a historian and an economist see {x} differently?",
                               "Describe {x} from the point of view of someone living through it.",
                               "What is the most common misunderstanding about {x}?")),
    "hum_sources": (_one, ("What questions would you ask to start researching {x}?",
                           "Write a timeline or a short list of key ideas for {x}.",
                           "Which three books or works would you read first to understand {x}, "
                           "and why?")),
}
for _family, _table, _templates in (("stem", W.STEM, _STEM_TEMPLATES),
                                    ("humanities", W.HUMANITIES, _HUMANITIES_TEMPLATES)):
    for _name, (_pick, _texts) in _templates.items():
        _phrasings(_family, _name, _pick(_table), _texts)


# ===================================================================== everyday chat
_PANTRY = ["rice", "eggs", "spinach", "chickpeas", "tomatoes", "potatoes", "cheese", "lentils",
           "onions", "pasta"]
_NAMEABLE = ["cat", "boat", "bakery", "podcast", "band", "robot"]

@_template("chat")
def howto(r):
    t = r.choice(W.HOWTO_TASKS)
    return (r.choice([f"How can I {t}?", f"Give me a step-by-step plan to {t}.",
                     f"What are the most common mistakes people make when they try to {t}?",
                     f"I want to {t}. Where should I start?"])
            + _style(r))


@_template("chat")
def trip_plan(r):
    return (f"Plan a {r.randint(2, 7)}-day trip to {r.choice(W.PLACES)} for "
            f"{r.choice(W.TRIP_KINDS)}.")


@_template("chat")
def recommend(r):
    return (r.choice([f"Recommend five {r.choice(W.GENRES)} books for {r.choice(W.AUDIENCES)}.",
                     f"What are some good gift ideas for {_a(r.choice(W.JOBS))}?",
                     f"Suggest a dinner I can cook with {', '.join(r.sample(_PANTRY, 3))}.",
                     f"Which is better for {r.choice(W.AUDIENCES)}: {r.choice(W.PRODUCTS)} or "
                     f"{r.choice(W.PRODUCTS)}?"])
            + _style(r))


@_template("chat")
def decide(r):
    a, b = r.sample(["move to a bigger city", "go back to university", "buy a car",
                     "learn to code", "adopt a dog", "change careers", "rent instead of buying",
                     "take a gap year", "start a small business", "work part-time"], 2)
    return (f"I can't decide whether to {a} or {b}. Can you help me think it through?"
            + _style(r))


@_template("chat")
def small_talk(r):
    return r.choice([f"What do you think about {r.choice(W.TOPICS)}?",
                     f"I'm bored. Tell me a fun fact related to {r.choice(W.TOPICS)}.",
                     f"What is a good way to start a conversation with {_a(r.choice(W.JOBS))} at a "
                     "party?", f"Tell me something interesting about {r.choice(W.PLACES)}.",
                     f"What are some fun things to do on a rainy {r.choice(W.WEEKDAYS)}?",
                     f"Can you tell me a joke about {_a(r.choice(W.JOBS))}?",
                     f"What would be a good name for a {r.choice(_NAMEABLE)}?"])


@_template("chat")
def explain_choice(r):
    a, b = r.sample(W.PRODUCTS, 2)
    return (r.choice([f"What should I look for when buying {a}?", f"Is {a} worth it? Give me the "
                     f"pros and cons.", f"Help me write a shopping list for a weekend in "
                     f"{r.choice(W.PLACES)}.", f"My friend says {b} is a waste of money. Who is "
                     "right?"])
            + _style(r))


@_template("chat")
def situation(r):
    who = r.choice(["my roommate", "my boss", "a coworker", "my neighbour", "my sister",
                    "my best friend", "my landlord", "my teenage son", "my partner"])
    issue = r.choice(["keeps borrowing my things without asking", "never replies to messages",
                      "is always late", "takes credit for my work", "plays loud music at night",
                      "wants to move to another country", "asked me for a large loan",
                      "forgot my birthday", "is stressed about exams"])
    return r.choice([f"{who.capitalize()} {issue}. What should I do?",
                     f"How do I talk to {who}, who {issue}?",
                     f"Give me three ways to handle this: {who} {issue}."]) + _style(r)

# ===================================================================== follow-up turns
# Second (and third) user turns by the kind of first turn; "any" suits every first turn. Each is
# a format string over SLOTS; the held-out split reserves some of them (by their text).
FOLLOWUPS: dict[str, tuple[str, ...]] = {
    "any": ("Can you make your answer shorter?", "Explain that in simpler words.",
            "Summarise your answer in three bullet points.",
            "What would be a good title for your answer?", "Can you give me a concrete example?",
            "Are you sure? Please double-check.", "Now explain it to {audience}.",
            "Translate your answer into {language}.", "What is the most important point here?",
            "Which part of your answer are you least confident about?"),
    "writing": ("Rewrite it in {tone} tone.", "Make it half as long.",
                "Now turn it into {poem}.", "Give it a catchy title.",
                "Rewrite it for {audience}.", "Add a surprising ending.",
                "What would you change to make it more vivid?",
                "Write a reply to it from the point of view of {job}.",
                "Rewrite it so that it rhymes.", "Now write it as a text message."),
    "math": ("Now solve the same problem if every number were doubled.",
             "Can you check your answer a different way?",
             "Write the solution as a short Python function.",
             "Explain which step is the easiest to get wrong.",
             "Make up a similar problem for me to solve.",
             "What if the last number in the problem were 10 instead?"),
    "code": ("Now write unit tests for it.", "What is the time complexity?",
             "Can you make it faster or simpler?", "Add type hints and a docstring.",
             "What happens with empty or invalid input? Handle it.",
             "Rewrite it in {proglang}.", "Explain the code line by line.",
             "Show an example of calling it, with the output."),
    "stem": ("What are the most common misconceptions about this?",
             "How is this used in everyday life?", "What are open questions about it?",
             "Give me a short quiz to test my understanding.",
             "How would you explain it with an analogy?", "Who were the key people behind it?"),
    "roleplay": ("Stay in character: what would you say to someone who disagrees?",
                 "What happens next? Continue the scene.", "Tell me about your biggest fear.",
                 "Now give me one piece of advice, still in character.",
                 "Drop the character and explain what you were trying to convey.",
                 "Describe your best memory, in character."),
    "extraction": ("Now give the same information as a table.",
                   "Which item is the most important, and why?", "Output it as JSON instead.",
                   "What is missing from the text that you would want to know?",
                   "Write one question that the text answers, and its answer."),
    "logic": ("How would the answer change if one of the facts were false?",
              "Explain your reasoning as if to a child.",
              "Make a harder puzzle of the same kind.", "Is there more than one possible answer?",
              "Which assumption does your answer depend on?"),
}
FOLLOWUP_GROUP = {"writing": "writing", "math": "math", "arithmetic": "math", "code": "code",
                  "stem": "stem", "humanities": "stem", "roleplay": "roleplay",
                  "extraction": "extraction", "logic": "logic", "chat": "any", "explain": "stem"}
