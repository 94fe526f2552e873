"""Word lists the templated prompt families draw their content from (written for this project;
no evaluation set was consulted). One item per line."""
from __future__ import annotations


def _lines(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.strip().splitlines() if x.strip())


NAMES = tuple("""
Aisha Alejandro Amara Amir Ana Andre Anika Arjun Astrid Ava Ben Bianca Carlos Chen Chloe Daniel
Dario Diego Elena Eli Emma Esther Ethan Fatima Felix Fiona Gabriel Grace Hana Hassan Helen Hiro
Ian Ingrid Isaac Isabel Ivan Jack Jamal Jana Jasmine Javier Jin Joao Jonas Julia Kai Karim Kate
Kenji Kofi Laila Lars Leo Lena Liam Lin Lucas Lucia Luis Maya Mei Mateo Mia Miguel Mila Mohamed
Nadia Naomi Nia Nikhil Noah Nora Olga Omar Oscar Pablo Paolo Priya Quinn Rafael Ravi Rosa Ruth
Sam Sana Sara Sean Sofia Sven Tariq Tess Theo Tomas Uma Valentina Victor Wei Yara Yusuf Zara Zoe
Ahmed Beatriz Camille Dmitri Emeka Farah Greta Hugo Imani Jorge Keiko Luca Marta Nils Olivia
Pedro Rahul Selin Tobias Ursula Vera Wanjiru Xavier Yuki Zainab
""".split())

PLACES = _lines("""
Lisbon
Nairobi
Kyoto
Montreal
Buenos Aires
Reykjavik
Cape Town
Hanoi
Edinburgh
Marrakesh
Vancouver
Istanbul
Oaxaca
Seoul
Tbilisi
Ljubljana
Cusco
Zanzibar
Queenstown
Bergen
Krakow
Singapore
Havana
Melbourne
Kathmandu
Porto
Dubrovnik
Cartagena
Chiang Mai
Tallinn
Valparaiso
Muscat
Florence
Santa Fe
Bruges
Hobart
Seville
Lima
Accra
Helsinki
the Scottish Highlands
the Atacama Desert
the Amalfi Coast
Patagonia
the Faroe Islands
Yellowstone
the Dolomites
Bali
the Great Barrier Reef
the Sahara
""")

FOODS = _lines("""
apples
oranges
cupcakes
cookies
muffins
pencils
notebooks
stickers
marbles
bananas
eggs
tomatoes
loaves of bread
bottles of juice
candles
books
toy cars
flowers
pies
sandwiches
seashells
stamps
trading cards
bracelets
jars of honey
potatoes
pumpkins
balloons
postcards
shirts
""")

ANIMALS = _lines("""
chickens
cows
sheep
goats
rabbits
ducks
horses
pigs
cats
dogs
fish
parrots
""")

JOBS = _lines("""
baker
nurse
software engineer
carpenter
teacher
farmer
librarian
pilot
chef
electrician
architect
journalist
pharmacist
mechanic
gardener
photographer
translator
accountant
marine biologist
firefighter
data analyst
tailor
park ranger
museum curator
dentist
plumber
veterinarian
florist
barista
event planner
""")

# Writing: what a text is about.
TOPICS = _lines("""
the first day at a new job
a city that never sleeps
learning to play the cello as an adult
a lighthouse keeper's last night
the smell of rain on hot pavement
growing tomatoes on a balcony
a friendship that survived a long distance
the invention of the printing press
a robot that wants to become a gardener
moving to a country where you do not speak the language
the quiet of a library at closing time
a grandmother's recipe book
climbing a mountain at dawn
a power outage that brought neighbours together
the last bookshop in town
a dragon afraid of heights
a train journey across a continent
saving a stray cat
the ocean at night
a childhood treehouse
a marathon run in the rain
a message in a bottle
an old map found in the attic
the first snow of winter
a town festival
a scientist's unexpected discovery
the importance of sleep
remote work
the benefits of reading fiction
urban gardening
public libraries
electric bicycles
learning a second language
the history of coffee
renewable energy in small towns
minimalism
volunteering
video games as art
the role of museums
the future of cities
friendship
failure as a teacher
the value of boredom
homemade bread
night skies and light pollution
a chess tournament
a lost umbrella
a bakery at 4 a.m.
an astronaut's view of Earth
a river that changed course
a family road trip
a village without internet
a musician's first concert
a garden in the desert
the end of summer
a time capsule
a broken clock
a surprise party gone wrong
an unlikely mentor
a rainy Sunday
""")

PRODUCTS = _lines("""
a reusable water bottle
noise-cancelling headphones
a smart thermostat
a standing desk
a solar phone charger
a language-learning app
an electric toothbrush
a hiking backpack
a budgeting app
a cast-iron skillet
a mechanical keyboard
a robot vacuum cleaner
a fitness tracker
a coffee grinder
an e-reader
a portable projector
a plant-care sensor
a bicycle helmet with lights
a meal-planning service
a pair of running shoes
""")

EMAIL_PURPOSES = _lines("""
ask for a deadline extension
decline a meeting invitation politely
thank a colleague for their help on a project
request a refund for a damaged order
introduce yourself to a new team
follow up after a job interview
invite neighbours to a community clean-up
apologise for missing an appointment
propose a new weekly meeting time
ask a professor for a letter of recommendation
announce a change in office hours
request time off next month
complain about a noisy construction site
congratulate a friend on a promotion
ask for feedback on a draft report
remind a client about an unpaid invoice
resign from a position on good terms
welcome a new member to a club
ask the landlord to fix the heating
share the minutes of yesterday's meeting
""")

RECIPIENTS = _lines("""
your manager
a customer service team
your landlord
a professor
a colleague
a client
your team
a hiring manager
a neighbour
a school principal
""")

TONES = _lines("""
formal
friendly
concise
enthusiastic
apologetic
persuasive
humorous
warm
neutral
diplomatic
""")

GENRES = _lines("""
science fiction
mystery
fantasy
historical fiction
horror
romance
adventure
fable
comedy
fairy tale
""")

POEM_FORMS = _lines("""
haiku
sonnet
limerick
free-verse poem
short rhyming poem
acrostic poem
ballad
villanelle
""")

AUDIENCES = _lines("""
a five-year-old
a high-school student
a university student
a busy executive
a complete beginner
an expert
a retiree
a tourist
""")

LANGUAGES = _lines("""
French
Spanish
German
Italian
Portuguese
Japanese
Chinese
Korean
Arabic
Hindi
Turkish
Dutch
""")

PROGRAMMING_LANGUAGES = _lines("""
JavaScript
TypeScript
C++
Java
Go
Rust
C#
Kotlin
Swift
Ruby
""")

STEM = {
    "physics": _lines("""
Newton's laws of motion
conservation of energy
entropy
the photoelectric effect
special relativity
quantum tunnelling
electromagnetic induction
the Doppler effect
superconductivity
wave-particle duality
friction
buoyancy
nuclear fission
black-body radiation
the uncertainty principle
"""),
    "chemistry": _lines("""
covalent bonds
the periodic table
oxidation and reduction
catalysts
pH and acidity
chemical equilibrium
isotopes
polymers
electronegativity
the ideal gas law
exothermic reactions
hydrogen bonding
"""),
    "biology": _lines("""
photosynthesis
cellular respiration
DNA replication
natural selection
the immune system
mitochondria
protein synthesis
meiosis
ecosystems and food webs
enzymes
the nervous system
homeostasis
CRISPR gene editing
antibiotic resistance
"""),
    "earth and space": _lines("""
plate tectonics
the water cycle
the greenhouse effect
black holes
the seasons
ocean currents
volcanoes
the life cycle of stars
tides
the formation of the solar system
earthquakes
exoplanets
"""),
    "computer science": _lines("""
recursion
hash tables
binary search
Big-O notation
garbage collection
public-key cryptography
TCP and UDP
dynamic programming
operating system schedulers
compilers and interpreters
neural networks
database indexes
version control
caching
concurrency and race conditions
graph traversal
floating-point arithmetic
virtual memory
"""),
    "mathematics": _lines("""
prime numbers
the Pythagorean theorem
derivatives
integrals
probability
matrices
logarithms
the normal distribution
complex numbers
mathematical induction
Bayes' theorem
vectors
the Fibonacci sequence
modular arithmetic
"""),
    "medicine and health": _lines("""
vaccines
blood pressure
sleep cycles
the gut microbiome
insulin and diabetes
anaesthesia
the placebo effect
cholesterol
"""),
    "engineering": _lines("""
suspension bridges
electric motors
semiconductors
jet engines
solar panels
batteries
water treatment
3D printing
"""),
}

HUMANITIES = {
    "history": _lines("""
the fall of the Roman Empire
the Industrial Revolution
the Renaissance
the French Revolution
the Silk Road
the printing press
the Cold War
the Meiji Restoration
the Age of Exploration
the abolition of slavery
the Ottoman Empire
ancient Egyptian civilisation
the Mongol Empire
the invention of writing
decolonisation in Africa
the space race
"""),
    "philosophy": _lines("""
utilitarianism
Stoicism
existentialism
Plato's theory of forms
the social contract
free will
the trolley problem
Confucian ethics
Descartes' "I think, therefore I am"
the ship of Theseus
"""),
    "economics": _lines("""
inflation
supply and demand
opportunity cost
comparative advantage
interest rates
the tragedy of the commons
monopolies
universal basic income
game theory
compound interest
"""),
    "literature and the arts": _lines("""
Impressionism
the hero's journey
Shakespeare's tragedies
magical realism
the Harlem Renaissance
haiku as a form
Baroque music
the modern novel
film noir
Romanticism
"""),
    "social sciences": _lines("""
cognitive dissonance
confirmation bias
urbanisation
the bystander effect
language acquisition in children
democracy and its forms
globalisation
social media and public opinion
Maslow's hierarchy of needs
"""),
}

ROLES = _lines("""
a seasoned detective
a pirate captain
a medieval knight
a friendly travel guide
a strict but fair chess coach
a Shakespearean actor
a startup founder pitching to investors
a nutritionist
a personal fitness trainer
a career counsellor
a museum tour guide
an astronaut on the International Space Station
a wise old wizard
a customer support agent
a history teacher
a sports commentator
a job interviewer
a poet laureate
a time traveller from the year 2300
a chef running a busy kitchen
a park ranger
a librarian
a stand-up comedian
a lawyer explaining a contract
a financial advisor
a language tutor
a therapist listening to a client
a news anchor
a sea captain in a storm
a video game character
""")

ROLE_REQUESTS = _lines("""
Introduce yourself and describe a typical day.
Give me advice about a problem I have: I can never finish what I start.
Tell me about the most difficult moment of your career.
Explain your job to someone who has never heard of it.
I have just arrived. What should I know first?
Convince me to follow your advice on saving money.
React to the news that the city's biggest park will be closed.
Describe what you see around you right now.
What is the one rule you never break, and why?
Give me three tips for my first week.
Answer a complaint from someone who waited two hours.
Share a story that taught you something important.
""")

HOWTO_TASKS = _lines("""
improve my sleep
start running as a beginner
save money on groceries
prepare for a job interview
learn to cook simple meals
keep houseplants alive
organise a small apartment
stay focused while working from home
make new friends in a new city
write a good CV
start journaling
reduce my screen time
plan a budget for the month
learn a new language quickly
prepare for a long flight
deal with stress before exams
choose a laptop for programming
start a vegetable garden
give a confident presentation
train a puppy
negotiate a salary
keep a conversation going
get better at chess
read more books
fix a leaking tap
change a flat bicycle tyre
make a good cup of coffee
study for a maths exam
write a thank-you speech
apologise to a friend
ask for a raise
start meditating
run a productive meeting
cook rice perfectly
build a simple website
back up my photos
choose a good password
talk to my kids about money
stop procrastinating
learn to swim as an adult
prepare for a marathon
care for an elderly parent
pack for a week with only a backpack
host a dinner party on a budget
become a better listener
get over jet lag
clean a cast-iron pan
pick a first programming language
prepare a healthy lunch for work
take better photos with my phone
write a short story
keep my car in good shape
set up a home office
make my garden attract bees
memorise a speech
learn to draw
recover after a bad day
decorate a small room
""")

TRIP_KINDS = _lines("""
a family with two young children
a solo traveller on a budget
a couple who love food
a group of students
a retired couple who enjoy museums
someone who loves hiking
a photographer
a first-time visitor
""")

COMPANIES = _lines("""
Northwind Analytics
Bluepeak Outdoor Gear
Greenleaf Grocers
Orbit Robotics
Cedar & Pine Furniture
Lumen Solar
Harbor Health Clinic
Quill Publishing
Brightpath Tutoring
Atlas Logistics
Maple Street Bakery
Vertex Software
""")

ADJECTIVES = _lines("""
excellent
disappointing
surprisingly good
average
frustrating
wonderful
overpriced
reliable
confusing
delightful
""")

PRODUCT_ASPECTS = _lines("""
battery life
price
customer service
build quality
ease of use
delivery time
design
sound quality
instructions
durability
""")

EVENTS = _lines("""
opened a new public library
announced a four-day work week
launched a bike-sharing programme
recorded its hottest summer
hosted an international chess tournament
approved a new park on the riverfront
started a free school meal programme
held its first marathon
discovered a Roman mosaic under a car park
opened a community solar farm
""")

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
COLOURS = ("red", "blue", "green", "yellow", "white", "black", "purple", "orange")
