"""The `openended` family: multi-turn conversations (two to four user turns) over open-ended
writing, roleplay, reasoning, STEM explanation, extraction and humanities tasks, where the first
turn carries explicit constraints (length, format, keywords, audience, a letter every sentence
starts with, ...) and the later turns rework the previous answer or continue the scene.

The single-turn families (writing, roleplay, ...) and `multiturn` (one generic follow-up) train
on short requests; chat benchmarks ask for longer constrained pieces and then change them, so
the target's answers there look different (longer, rewritten, conditioned on its own previous
answer). Each template here is one `Template` (the unit the held-out split reserves) whose
``make`` returns the list of turns. Written for this project; no evaluation set was consulted.
"""
from __future__ import annotations

import random

from . import prompt_words as W
from .prompt_templates import FAMILIES, Template, _a, _news, _review, fill

FAMILY = "openended"
FOLLOWUP_COUNTS = {1: 0.5, 2: 0.3, 3: 0.2}  # later turns per conversation

_HIGHLIGHTS = ("its food", "its history", "local festivals", "quiet neighbourhoods",
               "outdoor activities", "its architecture", "the markets", "getting around",
               "the people you met", "the music scene", "day trips nearby", "the weather")
_ACTIONS = ("try a plant-based dinner once a week", "volunteer at a local animal shelter",
            "learn a musical instrument", "cycle to work", "read one book a month",
            "start saving for retirement early", "support the public library",
            "join a team sport", "spend one day a week without a phone",
            "visit a museum this month", "learn first aid", "grow some of their own food",
            "write letters by hand", "take the train instead of flying for short trips")
_NEWS = ("a new product line", "longer opening hours", "a merger with a former rival",
         "a data breach and what customers should do now", "a partnership with a charity",
         "a price increase", "the recall of a faulty kettle", "a new branch in {place}",
         "a four-day work week for all staff", "the retirement of its founder")
_ASKS = (("a former professor", "a recommendation letter"), ("your manager", "a deadline "
         "extension"), ("a supplier", "a discount on a large order"), ("your landlord",
         "permission to paint the flat"), ("a possible mentor", "a 20-minute call"),
         ("a client", "feedback on a draft report"), ("a conference organiser",
         "a speaking slot"), ("the city council", "a new pedestrian crossing"))
_FICTIONAL = ("a science-fiction film about a city under the sea",
              "a jazz album recorded in a single night", "a cookbook for busy parents",
              "a phone whose battery lasts a week", "a board game about building railways",
              "a hotel inside an old lighthouse", "a podcast about forgotten inventors",
              "a musical about a bakery", "an electric bicycle that folds into a backpack",
              "a detective novel set on a night train")
_OPENINGS = ("The door had been locked from the inside.",
             "Nobody in the village had ever seen snow in June.",
             "The message arrived exactly one year too late.",
             "She counted the lights on the bridge for the last time.",
             "The robot asked for a day off.", "Every clock in the house stopped at noon.",
             "It was the smallest shop on the busiest street.")
_MEDIA = ("text messages", "diary entries", "letters", "a radio interview", "voicemails",
          "a ship's log")
_CHARACTERS = ("a grumpy lighthouse keeper", "a medieval blacksmith",
               "an overenthusiastic museum guide", "a detective in 1920s Chicago",
               "the cook on a nineteenth-century sailing ship", "a robot learning human customs",
               "a retired astronaut", "a sommelier at a very expensive restaurant",
               "an innkeeper in a fantasy village", "a tech support agent on a bad day",
               "a Roman senator", "a wildlife photographer in the Arctic",
               "an air traffic controller", "a dragon who collects books",
               "a barista who remembers every customer's order", "a tour guide on Mars")
_SCENES = ("I have just walked in and I look lost.", "I want to buy something but have "
           "almost no money.", "I am a journalist writing a profile of you.",
           "I am your new apprentice and it is my first day.",
           "I am a customer with a complaint.", "I am a child who asks a lot of questions.")
_SCENE_LINES = ("I don't believe you. Prove it.", "What would you recommend for someone like "
                "me?", "Tell me about the strangest thing that has happened to you.",
                "I have to leave soon. Any last advice?",
                "That sounds expensive. Is there a cheaper option?",
                "Say that again, but as if you were in a great hurry.",
                "Someone behind me is laughing at you. How do you react?",
                "What do you dislike most about your work?",
                "Can you teach me one thing you know that I don't?")
_EXPERTS = ("a career coach", "a personal finance adviser", "a fitness coach",
            "a travel agent", "a plant doctor", "a study skills tutor", "an interior designer",
            "a speech coach", "a negotiation trainer", "a sleep consultant")
_PROBLEMS = ("I have three job offers and can't choose.", "I spend more than I earn every month.",
             "I get out of breath climbing stairs.", "I have a week off and no plans.",
             "My houseplants keep dying.", "I forget everything I read.",
             "My living room feels dark and cramped.", "I freeze when I speak in meetings.",
             "My landlord wants to raise the rent by 20%.", "I wake up at 4 a.m. every night.")
_APPLICATIONS = ("designing a footbridge", "building a phone battery", "planning a mission to "
                 "the Moon", "growing tomatoes indoors", "training a neural network",
                 "baking bread", "cooling a data centre", "cleaning river water",
                 "forecasting tomorrow's weather", "designing a wind turbine")
_VOICES = ("a historian", "an economist", "a philosopher", "a farmer from 1850",
           "a modern teenager", "a journalist", "a town planner", "a retired diplomat")
_CATALOGUE = ("book", "film", "laptop", "hotel", "album")


# ------------------------------------------------------------------------------ constraints
def _constraints(r: random.Random, k: int | None = None) -> str:
    """Zero to two explicit constraints on a piece of writing."""
    options = [f"Keep it under {r.choice([80, 120, 150, 200, 250, 300])} words.",
               f"Use exactly {r.randint(2, 5)} paragraphs.",
               f"Include the words {', '.join(r.sample(W.ADJECTIVES, 2))} and "
               f"\"{r.choice(W.COLOURS)}\".",
               f"Start every sentence with the letter {r.choice('ABCDEFGHLMNPRSTW')}.",
               f"Do not use the word \"{r.choice(['very', 'really', 'amazing', 'good', 'thing'])}"
               "\".", "End with a question to the reader.", "Format it as a numbered list.",
               "Give it a title wrapped in double asterisks.", "Write it in the second person.",
               "Use at least two metaphors.", fill("Write it in {tone} tone.", r),
               fill("Make it suitable for {audience}.", r), "Avoid jargon.",
               "Answer in JSON with the keys \"title\" and \"body\".",
               "Include one short quotation from an imaginary expert.",
               "Use no more than three sentences per paragraph."]
    k = r.choice([0, 1, 1, 2]) if k is None else k
    return "".join(" " + c for c in r.sample(options, k))


_REWORK = ("Rewrite your previous answer in {tone} tone.",
           "Summarise your previous answer in {n} words.", "Turn it into {poem}.",
           "Rewrite it so that every sentence starts with the letter {L}.",
           "Now rewrite it for {audience}.",
           "Translate the first two sentences into {language}.",
           "List its three most important points as bullet points.",
           "Give it a catchy title and two subheadings.",
           "Which parts of your answer are weakest? Improve them.",
           "Add a concrete example to each main point.",
           "Rewrite it from the point of view of {job}.",
           "Put the key information into a table.",
           "Make it twice as long, with more detail.",
           "Write three questions a reader might ask after reading it, with short answers.",
           "Write a reply to it as {job}.", "Condense it into a single post of under 280 "
           "characters.", "Now do the same, but without any adjectives.",
           "Explain the choices you made when writing it.")
_DEEPER = ("Give a worked numerical example with realistic values.",
           "What are the limits of this idea: when does it stop being true?",
           "How would you explain it to {audience}?", "Design a simple experiment to test it.",
           "What do people most often get wrong about it?",
           "Write five quiz questions about it, with answers.",
           "Now argue the opposite position as convincingly as you can.",
           "Which thinkers or schools would disagree with you, and why?",
           "Summarise the debate in a table of arguments for and against.",
           "How does this apply to life today?")
_REASON_MORE = ("Check your answer a second way.", "Explain your reasoning step by step.",
                "Is there more than one possible answer? Show why or why not.",
                "Make up a harder puzzle of the same kind and solve it.",
                "Which step is the easiest to get wrong, and why?")
_DATA_MORE = ("Now output it as CSV.", "Sort the entries by {field}.",
              "Keep only the entries that {keep}.", "Add a field \"category\" and fill it in.",
              "Write one sentence that summarises the data.",
              "Which entry stands out the most, and why?")


def _conversation(r: random.Random, first: str, pools: tuple[tuple[str, ...], ...],
                  **given) -> list[str]:
    """The first turn, then one to three different later turns drawn from ``pools`` (filled
    with the given values and SLOTS)."""
    n = r.choices(list(FOLLOWUP_COUNTS), weights=list(FOLLOWUP_COUNTS.values()))[0]
    texts = list(dict.fromkeys(t for pool in pools for t in pool))
    given.setdefault("L", r.choice("ABCDEFGHLMNPRSTW"))
    given.setdefault("n", r.choice([30, 50, 75, 100]))
    return [first] + [fill(t, r, **given) for t in r.sample(texts, n)]


def _open(name: str):
    def register(fn):
        FAMILIES.setdefault(FAMILY, []).append(Template(f"{FAMILY}.{name}", fn))
        return fn
    return register


# ------------------------------------------------------------------------------ writing
@_open("travel")
def travel(r):
    form = r.choice(["travel blog post", "postcard message", "travel diary entry",
                     "guidebook introduction", "newsletter article"])
    a, b = r.sample(_HIGHLIGHTS, 2)
    first = (f"Write {_a(form)} about a {r.randint(2, 10)}-day "
             f"trip to {r.choice(W.PLACES)}, highlighting {a} and {b}.{_constraints(r)}")
    return _conversation(r, first, (_REWORK,))


@_open("persuade")
def persuade(r):
    form = r.choice(["short speech", "letter", "blog post", "radio advert", "op-ed"])
    first = (f"Write a persuasive {form} that convinces {r.choice(W.AUDIENCES)} to "
             f"{r.choice(_ACTIONS)}.{_constraints(r)}")
    return _conversation(r, first, (_REWORK, ("Now write the strongest reply against it.",
                                              "Which argument in it is the weakest?")))


@_open("announcement")
def announcement(r):
    news = fill(r.choice(_NEWS), r, place=r.choice(W.PLACES))
    form = r.choice(["a press release", "an email to customers", "a post for the staff "
                     "intranet", "a short video script"])
    first = f"Draft {form} from {r.choice(W.COMPANIES)} about {news}.{_constraints(r)}"
    return _conversation(r, first, (_REWORK, ("Now write the questions a reporter would ask, "
                                              "and the company's answers.",)))


@_open("story")
def story(r):
    how = r.choice([f"begins with the sentence \"{r.choice(_OPENINGS)}\"",
                    f"is told entirely through {r.choice(_MEDIA)}",
                    f"takes place in {r.choice(W.PLACES)} within a single hour",
                    f"features {_a(r.choice(W.JOBS))} and a lost "
                    f"{r.choice(['key', 'map', 'letter', 'violin', 'umbrella'])}"])
    first = f"Write a short {r.choice(W.GENRES)} story that {how}.{_constraints(r)}"
    return _conversation(r, first, (_REWORK, ("Continue the story with what happens the next "
                                              "day.", "Rewrite the ending so it is happier.",
                                              "Tell the same story from another character's "
                                              "point of view.")))


@_open("request_email")
def request_email(r):
    who, what = r.choice(_ASKS)
    first = (f"Write {r.choice(['a professional', 'a friendly', 'a short', 'a polite'])} email "
             f"to {who} asking for {what}.{_constraints(r)}")
    return _conversation(r, first, (_REWORK, ("Now write the reply, saying no politely.",
                                              "Make it more direct.")))


@_open("review")
def review(r):
    first = (f"Write a review of {r.choice(_FICTIONAL)}, with a rating out of "
             f"{r.choice([5, 10])}.{_constraints(r)}")
    return _conversation(r, first, (_REWORK, ("Now write a one-star review of the same thing.",
                                              "Write the creator's response to your review.")))


@_open("complaint")
def complaint(r):
    problem = r.choice(["a parcel that arrived three weeks late", "a hotel room that was not "
                        "cleaned", "being charged twice", "a flight cancelled without notice",
                        "a broken washing machine still under warranty", "rude staff",
                        "a subscription that cannot be cancelled online"])
    first = f"Write a complaint letter to {r.choice(W.COMPANIES)} about {problem}.{_constraints(r)}"
    return _conversation(r, first, (_REWORK, ("Now write the company's reply.",
                                              "Make it firmer but still polite.")))


@_open("poem_rules")
def poem_rules(r):
    rule = r.choice([f"has exactly {r.randint(4, 12)} lines", "rhymes in every pair of lines",
                     "never uses the letter e", "uses only words of one syllable",
                     f"starts every line with the word "
                     f"\"{r.choice(['When', 'Still', 'Here', 'Once'])}\"",
                     "ends with the same line it begins with"])
    first = fill(f"Write a poem about {{topic}} that {rule}.", r) + _constraints(r)
    return _conversation(r, first, (_REWORK[:6], ("Explain the images you used.",
                                                  "Write a second verse.")))


@_open("plan")
def plan(r):
    first = (f"Make a {r.randint(2, 8)}-week plan to help me {r.choice(W.HOWTO_TASKS)}."
             f"{_constraints(r, r.choice([0, 1]))}")
    return _conversation(r, first, (_REWORK[6:12], ("Turn the first week into a daily "
                                                    "checklist.", "What should I do if I fall "
                                                    "behind?", "Which step matters most?")))


@_open("compare")
def compare(r):
    a, b = r.choice([("renting", "buying a home"), ("an electric car", "a hybrid"),
                     ("Python", "JavaScript as a first programming language"),
                     ("learning alone", "taking a class"), ("a gym membership",
                     "exercising at home"), ("a city flat", "a house in the countryside"),
                     ("a gap year", "starting university straight away"),
                     ("paper books", "e-readers")])
    who = r.choice(["a student", "a young family", "a retired couple", "someone on a tight budget",
                    "me: I live alone in a big city", "a small business owner"])
    first = f"Compare {a} and {b} in a table, and then recommend one for {who}.{_constraints(r)}"
    return _conversation(r, first, (_REWORK[:10], ("What if my budget were half as big?",
                                                   "What would change your recommendation?")))


# ------------------------------------------------------------------------------ roleplay
@_open("character")
def character(r):
    first = (f"Pretend to be {r.choice(_CHARACTERS)} and stay in character for the rest of our "
             f"conversation. My name is {r.choice(W.NAMES)}. {r.choice(_SCENES)}")
    return _conversation(r, first, (_SCENE_LINES,))


@_open("adviser")
def adviser(r):
    first = (f"Act as {r.choice(_EXPERTS)}. I will describe my situation and you will advise "
             f"me. I am {r.randint(18, 75)} and work as {_a(r.choice(W.JOBS))}. "
             f"{r.choice(_PROBLEMS)}")
    return _conversation(r, first, (_SCENE_LINES[:5], ("What should I do first, this week?",
                                                        "What if that does not work?",
                                                        "Summarise your advice as a plan.")))


@_open("interview")
def interview(r):
    question = r.choice(["how did you end up doing what you do?", "what does a bad day look "
                         "like for you?", "what is the biggest myth about your work?",
                         "who taught you the most?", "what would you change about your "
                         "world?", "what do you carry with you every day, and why?"])
    first = (f"You are {r.choice(_CHARACTERS)}, and I am {r.choice(W.NAMES)}, interviewing you "
             f"for a {r.choice(['podcast', 'school project', 'newspaper', 'documentary'])}. "
             f"Answer in character. First question: {question}")
    return _conversation(r, first, (_SCENE_LINES[2:], ("What is a typical day like for you?",
                                                       "What do you hope people remember about "
                                                       "you?")))


@_open("guide")
def guide(r):
    when = r.choice(["in the morning", "at night", "in the rain", "on a holiday"])
    first = (f"Be my guide: you are {r.choice(_CHARACTERS)} showing me around "
             f"{r.choice(W.PLACES)} {when}. Describe where we are and what we should see first.")
    return _conversation(r, first, (_SCENE_LINES, ("Where should we eat tonight?",
                                                   "Tell me a local legend.")))


# ------------------------------------------------------------------------------ reasoning
@_open("directions")
def directions(r):
    unit = r.choice(["blocks", "km", "miles"])
    steps = [f"{r.randint(1, 9)} {unit} {r.choice(['north', 'east', 'south', 'west'])}"
             for _ in range(r.randint(3, 5))]
    first = (f"Starting at the {r.choice(['library', 'station', 'museum', 'market'])}, I walk "
             f"{', then '.join(steps)}. How far am I from where I started, in a straight line, "
             "and in which direction?")
    return _conversation(r, first, (_REASON_MORE, ("What if the last leg had been the other "
                                                   "way?",)))


@_open("overlap")
def overlap(r):
    n, both = r.randint(20, 40), r.randint(2, 8)
    a, b = both + r.randint(2, 10), both + r.randint(2, 10)
    x, y = r.sample(["football", "chess", "the choir", "drama", "robotics", "swimming",
                     "the school paper"], 2)
    first = (f"In a class of {n} students, {a} do {x}, {b} do {y} and {both} do both. How many "
             f"students do neither? Explain.")
    return _conversation(r, first, (_REASON_MORE, (f"If {r.randint(2, 6)} new students join and "
                                                   f"all of them do {y}, what changes?",)))


@_open("arrangement")
def arrangement(r):
    people = r.sample(W.NAMES, r.randint(4, 5))
    clues = []
    for a, b in zip(people, people[1:]):
        clues.append(r.choice([f"{a} is somewhere to the left of {b}",
                               f"{b} is somewhere to the right of {a}",
                               f"{a} sits directly next to {b}"]))
    r.shuffle(clues)
    first = (f"{', '.join(people)} sit in a row of {len(people)} chairs. Clues: "
             f"{'; '.join(clues)}. Give one seating order that fits every clue, and say whether "
             "it is the only one.")
    return _conversation(r, first, (_REASON_MORE, ("Add one clue that makes the order unique.",)))


@_open("schedule")
def schedule(r):
    tasks = r.sample(["a dentist appointment", "a team meeting", "grocery shopping",
                      "a run", "a call with a client", "cooking dinner", "picking up a parcel",
                      "an online class"], 4)
    lengths = [r.choice([30, 45, 60, 90]) for _ in tasks]
    rule = r.choice([f"{tasks[0]} must happen before noon", f"{tasks[1]} cannot be first",
                     f"there must be a 30-minute break after {tasks[2]}"])
    first = ("Plan my day between 9:00 and 17:00. I have " + ", ".join(
        f"{t} ({m} minutes)" for t, m in zip(tasks, lengths)) + f", and {rule}. Make a "
             "timetable and explain it.")
    return _conversation(r, first, (_REASON_MORE[:3], (f"Now {tasks[3]} has to start at 15:00. "
                                                       "Update the plan.",
                                                       "Show it as a table.")))


# ------------------------------------------------------------------------------ STEM / humanities
@_open("stem_deep")
def stem_deep(r):
    field = r.choice(list(W.STEM))
    x = r.choice(W.STEM[field])
    first = (r.choice([f"Explain {x} and why it matters in {field}.",
                       f"How does {x} matter for {r.choice(_APPLICATIONS)}?",
                       f"I keep mixing up the details of {x}. Can you explain it clearly?"])
             + _constraints(r, r.choice([0, 1])))
    return _conversation(r, first, (_DEEPER[:6], _REWORK[:8]))


@_open("humanities_essay")
def humanities_essay(r):
    field = r.choice(list(W.HUMANITIES))
    x = r.choice(W.HUMANITIES[field])
    first = (r.choice([f"Write a short essay on {x}.", f"What were the causes and effects of "
                       f"{x}?", f"Why do people still argue about {x}?"])
             + _constraints(r, r.choice([0, 1])))
    return _conversation(r, first, (_DEEPER[4:], _REWORK[:8]))


@_open("debate")
def debate(r):
    a, b = r.sample(_VOICES, 2)
    topic = r.choice(r.choice([W.HUMANITIES[f] for f in W.HUMANITIES]))
    first = f"Write a dialogue in which {a} and {b} debate {topic}.{_constraints(r, 0)}"
    return _conversation(r, first, (_DEEPER[6:], ("Who won the debate, and why?",
                                                  "Add a third voice who disagrees with both.")))


@_open("how_it_works")
def how_it_works(r):
    thing = r.choice(["a refrigerator", "noise-cancelling headphones", "a card payment",
                      "GPS", "a vaccine", "a lift", "a search engine", "recycling plastic",
                      "the tides", "a touchscreen", "a heat pump", "a microwave oven",
                      "a blockchain", "a 3D printer", "a hearing aid"])
    first = (r.choice([f"Explain how {thing} works.", f"What actually happens inside {thing}?",
                       f"How does {thing} work, and what can go wrong with it?"])
             + fill(r.choice(["", " Write for {audience}."]), r)
             + _constraints(r, r.choice([0, 1])))
    return _conversation(r, first, (_DEEPER[:6], _REWORK[:8]))


@_open("method")
def method(r):
    task = r.choice(["calculate compound interest", "find the area of an irregular shape",
                     "solve a quadratic equation", "convert fractions to percentages",
                     "estimate a square root by hand", "compute a weighted average",
                     "work out a probability with two dice", "read a supply and demand chart",
                     "balance a chemical equation", "find a percentage change"])
    first = (r.choice([f"Explain how to {task}, with a worked example.",
                       f"Teach me to {task}, step by step.",
                       f"What is the easiest way to {task}? Show an example."])
             + fill(r.choice(["", " Explain it for {audience}."]), r)
             + _constraints(r, r.choice([0, 1])))
    return _conversation(r, first, (_DEEPER[:2], ("Give me a practice problem and its solution.",
                                                  "Show a common mistake and how to avoid it.",
                                                  "Now do it with different numbers.")))


@_open("dilemma")
def dilemma(r):
    case = r.choice(["cities ban cars from their centres", "homework is abolished in primary "
                     "schools", "museums return objects taken in colonial times",
                     "employers track their staff's keyboard activity", "voting is compulsory",
                     "children under 14 are kept off social media", "tourist numbers are "
                     "capped in old towns", "robots replace cashiers"])
    first = (r.choice([f"Is it a good idea that {case}? Give the arguments on both sides, then "
                       "your view.", f"Some people want it so that {case}. Who gains, who loses?",
                       f"Write a balanced analysis of a proposal that {case}.",
                       f"Suppose {case}. What would change after five years?"])
             + _constraints(r))
    return _conversation(r, first, (_DEEPER[6:], ("What would change your mind?",
                                                  "Write it as a short speech.")))


# ------------------------------------------------------------------------------ extraction
@_open("article")
def article(r):
    text = r.choice([_news, _review])(r)
    first = (r.choice(["Summarise this text in three sentences, then list what it leaves "
                       "unclear.", "Extract every name, place, date and number in this text "
                       "as JSON, grouped by kind.", "What is the main point of this text, and "
                       "who would care about it?"]) + f"\n\n{text}")
    return _conversation(r, first, (_DATA_MORE[3:], _REWORK[:8]))

def _catalogue(r, kind):
    names = {"book": ["The Glass Orchard", "North of Silence", "A Map of Small Things",
                      "The Last Ferry", "Copper Skies", "Winter Arithmetic"],
             "film": ["Harbour Lights", "The Quiet Engine", "Paper Moons", "Seventh Summer",
                      "Red Meridian", "Low Tide"],
             "laptop": ["Aero 14", "Nimbus Pro", "Vantage X2", "Orbit Air", "Kestrel 16",
                        "Slate Go"],
             "hotel": ["The Old Mill", "Harbour House", "Hotel Cordelia", "The Birch Lodge",
                       "Casa Luz", "The Signal Tower"],
             "album": ["Night Bus Songs", "Tidal", "Orange Hours", "Small Engines",
                       "Glasshouse", "Northbound"]}[kind]
    lines = []
    for title in r.sample(names, r.randint(3, 5)):
        year, price, rating = r.randint(1995, 2025), r.randint(8, 1900), r.randint(1, 5)
        lines.append(r.choice([f"{title} came out in {year}, costs ${price} and is rated "
                               f"{rating}/5.", f"Rated {rating} stars, {title} ({year}) sells for "
                               f"${price}.", f"For ${price} you get {title}, released in {year}; "
                               f"reviewers give it {rating} out of 5."]))
    return " ".join(lines)


@_open("catalogue")
def catalogue(r):
    kind = r.choice(_CATALOGUE)
    first = (f"Extract every {kind} in this text as JSON with the fields name, year, price and "
             f"rating.\n\n{_catalogue(r, kind)}")
    return _conversation(r, first, (_DATA_MORE,), field=r.choice(["year", "price", "rating"]),
                         keep=r.choice(["came out after 2010", "cost less than $100",
                                        "are rated 4 or more"]))


@_open("messages")
def messages(r):
    people = r.sample(W.NAMES, 3)
    asks = r.sample(["send the slides", "book a room for Thursday", "review the budget",
                     "call the supplier", "approve the holiday request", "fix the printer",
                     "update the website"], 3)
    text = "\n".join(f"From {p}: Could you {a} by {r.choice(W.WEEKDAYS[:5])}? "
                     f"{r.choice(['Thanks!', 'It is urgent.', 'No rush.', 'Let me know.'])}"
                     for p, a in zip(people, asks))
    first = ("For each message below, identify the sender, the request, the deadline and how "
             f"urgent it is. Answer as a table.\n\n{text}")
    return _conversation(r, first, (_DATA_MORE[2:], ("Write a short reply to each message.",
                                                     "Which one should I do first?")),
                         field="deadline", keep="are urgent")


@_open("figures")
def figures(r):
    companies = r.sample(W.COMPANIES, r.randint(2, 3))
    parts = []
    for c in companies:
        rev = r.randint(5, 400)
        quarter = f"{r.choice(['Q1', 'Q2', 'Q3', 'Q4'])} {r.randint(2019, 2025)}"
        parts.append(f"{c} reported revenue of ${rev} million and a profit of "
                     f"${r.randint(1, max(2, rev // 3))} million in {quarter}.")
    first = (r.choice(["Which company had the highest profit margin? Show the numbers.",
                       "Extract the figures as a table with company, quarter, revenue and "
                       "profit.", "Rank the companies by profit."]) + "\n\n" + " ".join(parts))
    return _conversation(r, first, (_DATA_MORE, _REASON_MORE[:2]), field="revenue",
                         keep="made more than $50 million")

