"""Plain chat requests, the way people type them: a question or a task in one line, no style instruction, about
one of ~600 subjects (the `--prompts chat` set). Answers to them are long explanations, lists and code, which
is what a chat's drafts meet; the templated set (prompts.py) leans to short, formulaic answers.

Every HELD_OUT-th entry of each list is kept out of training, for the held-out shard. None of the prompts of
scripts/draft_eval.py or the bench's defaults is here: they measure the draft on requests it never saw.
"""
from __future__ import annotations

import random

from peers.distill.prompts import CODE_TASKS, HELD_OUT, LANGUAGES, TOPICS


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.replace("\n", " ").split(";") if t.strip()]


SUBJECTS = TOPICS + _split("""
general relativity; special relativity; the speed of light; dark matter; dark energy; the Big Bang; neutron stars;
supernovas; exoplanets; the Milky Way; comets; asteroids; the International Space Station; satellites; the ozone
layer; the greenhouse effect; ocean currents; the carbon cycle; the nitrogen cycle; erosion; glaciers; fossils;
radioactivity; nuclear fusion; semiconductors; transistors; lasers; fiber optics; radio waves; microwaves; X-rays;
MRI scans; ultrasound; the placebo effect; the gut microbiome; metabolism; hormones; insulin; cholesterol;
blood pressure; allergies; the common cold; migraines; dehydration; caffeine; sugar; intermittent fasting;
protein; carbohydrates; dietary fiber; the Mediterranean diet; strength training; stretching; posture; running
shoes; swimming; cycling; team sports; mindfulness; procrastination; burnout; anxiety; loneliness; gratitude;
empathy; critical thinking; decision making; cognitive biases; the scientific method; peer review; statistics in
the news; correlation and causation; game theory; opportunity cost; interest rates; mortgages; credit scores;
index funds; retirement savings; cryptocurrency; insurance; the gig economy; minimum wage; universal basic
income; globalization; tariffs; central banks; recessions; unemployment; open source software; version control;
unit testing; continuous integration; microservices; containers; Docker; Kubernetes; REST APIs; GraphQL;
web servers; HTTP; DNS; TCP and UDP; IP addresses; routers; Wi-Fi; Bluetooth; 5G networks; encryption; public key
cryptography; two-factor authentication; phishing; firewalls; VPNs; password managers; data privacy; cookies on
websites; search engines; recommendation systems; neural networks; large language models; computer vision;
speech recognition; self-driving cars; robotics; 3D printing; virtual reality; augmented reality; the Internet of
Things; smart homes; quantum cryptography; edge computing; big data; data visualization; spreadsheets; regular
expressions; object-oriented programming; functional programming; garbage collection; memory leaks; threads and
processes; deadlocks; caching; load balancing; database indexes; SQL joins; NoSQL databases; big O notation;
graph algorithms; trees in computer science; stacks and queues; sorting; type systems;
APIs; debugging; code reviews; technical debt; agile development; product management; user experience design;
accessibility on the web; responsive design; CSS; HTML; TypeScript; React; Node.js; C++; Java; Go; Kotlin; Swift;
the Byzantine Empire; the Ottoman Empire; the Mongol Empire; the Aztecs; the Incas; the Maya; ancient Greece;
the Han dynasty; feudalism; the Black Death; the Reformation; the Enlightenment; the American Revolution; the
abolition of slavery; the Meiji Restoration; World War II; the United Nations; the European Union; the space
race; the fall of the Berlin Wall; the civil rights movement; women's suffrage; the printing of money;
the Magna Carta; the Olympic Games in ancient times; samurai; knights; pirates; castles; pyramids; Stonehenge;
the Colosseum; Machu Picchu; the Amazon river; the Sahara; the Himalayas; the Great Barrier Reef; Antarctica;
Iceland; Japan; Brazil; Kenya; India; Canada; Australia; Egypt; Norway; Mexico; volcanic islands; national parks;
urban planning; public transport; traffic jams; electric scooters; high-speed rail; container shipping;
airports; the postal service; libraries in the digital age; newspapers; podcasts; streaming services; film
making; animation; comic books; video game design; stand-up comedy; theatre; opera; ballet; hip hop; rock music;
classical music; the violin; drums; singing; songwriting; learning an instrument; impressionism; abstract art;
street art; pottery; calligraphy; woodworking; sewing; interior design; minimalism; decluttering; cleaning a
kitchen; doing laundry; ironing clothes; cooking rice; making pasta; grilling; fermentation; sourdough; spices;
coffee brewing; herbal tea; food safety; meal planning; grocery shopping on a budget; composting at home;
raising chickens; beekeeping; growing herbs; lawn care; pruning trees; pest control in gardens; houseplant
care; adopting a dog; training a puppy; caring for a cat; aquariums; horses; owls; octopuses; sharks; dolphins;
ants; butterflies; spiders; frogs; snakes; migration of birds; hibernation; camouflage; photosynthesis in algae;
mushrooms; trees; seeds; pollination; endangered species; zoos; wildlife conservation; deforestation; ocean
plastic; air pollution; water scarcity; electric grids; hydrogen fuel; geothermal energy; energy efficiency at
home; insulation; heat pumps; carbon footprints; sustainable fashion; fast fashion; parenting toddlers; teenagers;
sibling rivalry; screen time for kids; homeschooling; learning to read; studying for exams; note taking;
speed reading; memory techniques; online courses; scholarships; choosing a university; apprenticeships; career
changes; asking for a raise; working from home; running a meeting; giving feedback; handling conflict at work;
networking; personal branding; starting a podcast; starting a small business; writing a business plan;
customer service; pricing a product; inventory management; e-commerce; freelancing; contracts; copyright;
patents; trademarks; the jury system; human rights; voting systems; free speech; the separation of powers;
local government; volunteering; charity; wedding planning; hosting a dinner party; gift giving; birthdays;
holidays around the world; New Year traditions; etiquette; tipping; learning to drive; car maintenance; flat
tires; road trips; jet lag; travel insurance; learning Japanese; learning Spanish; sign language; dialects;
etymology; idioms; the history of English; writing fiction; writing a speech; journaling; reading habits;
book clubs; science fiction; detective stories; Greek mythology; Norse mythology; folklore; superstitions;
optical illusions; dreams; lucid dreaming; the sense of smell; taste buds; left-handedness; laughter;
yawning; hiccups; goosebumps; sunburn; skin care; hair loss; dental hygiene; vision correction; hearing aids""")

DEVICES = _split("""a microwave oven; a washing machine; a dishwasher; an air conditioner; a heat pump; a toaster; a
vacuum cleaner; a smoke detector; a thermostat; a light bulb; an LED; a solar panel; a wind turbine; a battery;
a lithium-ion battery; an electric motor; a car engine; a hybrid car; a jet engine; a helicopter; a parachute;
a hot air balloon; an elevator; an escalator; a lock and key; a zipper; a compass; a barometer; a thermometer;
a camera; a touchscreen; a computer mouse; a keyboard; a hard drive; a solid state drive; a CPU; a GPU; a
printer; a 3D printer; a QR code; a barcode scanner; a credit card chip; an ATM; a GPS receiver; a radio; a
speaker; a pair of noise-cancelling headphones; a microphone; a telescope; a microscope; a pacemaker; a hearing aid;
an X-ray machine; a vaccine; a water filter; a sewage treatment plant; a dam; a nuclear reactor; a rocket;
a submarine; a sailboat; a bicycle gear; a suspension bridge; a traffic light; a search engine; a spam filter;
an email server; a web browser; a compiler; a blockchain; a password hash""")

ACTIVITIES = _split("""saving money; sleeping better; learning to cook; staying focused while studying; running
my first 5K; learning to swim; making friends in a new city; writing a resume; preparing for a job interview;
giving a presentation; negotiating a salary; starting a vegetable garden; keeping houseplants alive; training a
puppy; reducing stress; drinking more water; eating healthier on a budget; learning a new language; reading
more books; writing a novel; taking better photos with a phone; planning a wedding; moving to a new apartment;
packing light for a trip; traveling with kids; camping for the first time; hiking safely; learning to code;
becoming a better listener; managing time; working from home; staying motivated; building a habit; quitting
sugar; getting up early; keeping a journal; organizing a closet; decorating a small room; hosting a party;
buying a used car; driving in snow; saving energy at home; cutting my phone time; teaching a child to read;
helping a teenager with homework; caring for an elderly parent; dealing with a difficult coworker; leading a
team; running a meeting; starting a blog; growing a small business; learning to draw; playing the guitar;
practising meditation; improving my handwriting; memorizing a speech; studying for a math exam; writing
clearly; learning chess; baking cookies; making coffee at home; brewing tea; cooking for one""")

PROBLEMS = _split("""My laptop gets very hot when I play games. What could be wrong?; My bread did not rise. What
went wrong?; My car makes a squeaking noise when I brake. What could it be?; My phone battery drains very fast.
How can I fix it?; My Wi-Fi keeps disconnecting. What should I check?; My basil plant is wilting. What should I
do?; My dog keeps barking at night. How can I stop it?; My cat stopped eating. Should I be worried?; I can't fall
asleep at night. What can I do?; My code throws an IndexError. What does that mean?; My Python script is very
slow. How can I speed it up?; My git push was rejected. What should I do?; My website loads slowly. What are the
usual causes?; My sourdough starter smells like nail polish. Is it ruined?; My knees hurt after running. What
could cause it?; My toddler refuses to eat vegetables. Any ideas?; My printer says it is offline. How do I fix
it?; My computer makes a clicking noise. What does it mean?; My fridge is leaking water. Why?; My eyes feel
tired after working on a screen. What helps?; My kid is being bullied at school. What should I do?; My
houseplant has brown leaf tips. What is wrong?; My cake sank in the middle. Why?; My SQL query returns
duplicates. Why would that happen?; My bike chain keeps falling off. How do I fix it?; My team misses every
deadline. What can I change?; I keep forgetting people's names. How can I remember them?; I get nervous before
exams. How can I calm down?; My email goes to people's spam folder. Why?; My shower water is never hot enough.
What could be wrong?; My lawn has yellow patches. What causes that?; My JavaScript function returns undefined.
Why?; My budget never lasts until the end of the month. Where do I start?; My rice always turns out mushy. What
am I doing wrong?; I feel tired all the time. What could be the reason?""")

PAIRS = _split("""a virus and a bacterium; weather and climate; a crocodile and an alligator; a latte and a
cappuccino; RAM and storage; a compiler and an interpreter; TCP and UDP; HTTP and HTTPS; a process and a thread;
a stack and a queue; an array and a linked list; SQL and NoSQL databases; Python and JavaScript; Git and GitHub;
machine learning and deep learning; AI and automation; a debit card and a credit card; stocks and bonds; a Roth
IRA and a traditional IRA; saving and investing; a hurricane and a tornado; a meteor and a meteorite; an
asteroid and a comet; a star and a planet; mass and weight; speed and velocity; heat and temperature; an atom
and a molecule; a cold and the flu; a psychologist and a psychiatrist; empathy and sympathy; affect and effect;
who and whom; a simile and a metaphor; baking soda and baking powder; a frog and a toad; a rabbit and a hare;
a republic and a democracy; a leader and a manager; a resume and a CV; a dolphin and a porpoise; a violin and a
viola; jam and jelly; a town and a city; the UK and Great Britain; a sweet potato and a yam""")

PLACES = _split("""Rome; London; Tokyo; Kyoto; Barcelona; Lisbon; Amsterdam; Berlin; Prague; Vienna; Istanbul;
New York; San Francisco; Chicago; Mexico City; Buenos Aires; Rio de Janeiro; Cape Town; Marrakech; Cairo;
Dubai; Mumbai; Bangkok; Singapore; Seoul; Sydney; Melbourne; Vancouver; Reykjavik; Edinburgh; Dublin; Athens;
Florence; Venice; Copenhagen; Stockholm; Budapest; Kraków; Hanoi; Bali""")

THINGS = _split("""the ocean at dawn; a rainy afternoon; an old library; autumn leaves; a city at night; a
mountain lake; the first snow; a busy train station; a summer garden; a thunderstorm; a quiet forest; a
desert at sunset; a grandmother's kitchen; a full moon; a winter morning; the sea in a storm; a field of
sunflowers; a childhood home; a long road trip; a village market; the stars over the sea; a river in spring;
an empty beach; a robot learning to feel; a cat watching birds; a friendship that lasted years""")

CREATURE_QUESTIONS = _split("""Why do dogs wag their tails?; Why do birds sing in the morning?; How do bees make
honey?; Why do leaves change color in autumn?; Why is the sky blue?; Why do we dream?; Why do onions make us cry?;
How do fish breathe underwater?; Why do zebras have stripes?; How do bats find their way in the dark?; Why do
cats knead with their paws?; Why do we get goosebumps?; Why does bread go stale?; How do plants know which way is
up?; Why do owls hunt at night?; How do chameleons change color?; Why do dogs sniff everything?; Why does ice
float?; Why do we yawn?; How do salmon find their way home?; Why do some birds migrate?; Why do giraffes have long
necks?; How do spiders spin webs?; Why is the ocean salty?; Why do stars twinkle?; How do vaccines train the
immune system?; Why do we have fingerprints?; Why do our ears pop on a plane?; How do ants find food?; Why do
parrots talk?""")

EXPLAIN = ["Explain {s} in simple terms.", "What is {s}?", "How does {s} work?", "What are the advantages of {s}?",
           "What are the main challenges of {s}?", "Can you explain {s}?", "Tell me about {s}.",
           "Why is {s} important?", "What are the benefits and drawbacks of {s}?", "Give me an overview of {s}.",
           "I'm curious about {s}. Where should I start?", "What is the history of {s}?",
           "What are some common myths about {s}?", "What should I know about {s}?",
           "What are the key ideas behind {s}?", "How would you explain {s} to a friend?"]
CODE = [t for t in CODE_TASKS if "Fibonacci" not in t]  # draft_eval asks for Fibonacci
FORMS = {  # kind: (what it is about, how it is asked)
    "explain": (SUBJECTS, EXPLAIN),
    "device": (DEVICES, ["How does {s} work?", "Explain how {s} works.", "What are the main parts of {s}?"]),
    "tips": (ACTIVITIES, ["Give me {n} tips for {s}.", "How do I get better at {s}?",
                          "What is the best way to start {s}?", "I need advice on {s}."]),
    "problem": (PROBLEMS, ["{s}"]),
    "compare": (PAIRS, ["What is the difference between {s}?", "How do I tell apart {s}?", "Compare {s}."]),
    "travel": (PLACES, ["Plan a weekend in {s}.", "What should I see in {s}?",
                        "I have three days in {s}. What should I do?", "What food should I try in {s}?"]),
    "write": (THINGS, ["Write a short poem about {s}.", "Write a short story about {s}.",
                       "Describe {s} in a few sentences.", "Write a haiku about {s}."]),
    "why": (CREATURE_QUESTIONS, ["{s}"]),
    "code": (CODE, ["Write a {lang} function that {s}.", "How do I write a {lang} program that {s}?",
                    "Show me {lang} code that {s}, and explain it."]),
}
WEIGHTS = {"explain": 8, "device": 2, "tips": 3, "problem": 2, "compare": 2, "travel": 1, "write": 2, "why": 1,
           "code": 2}


def _pool(items: list[str], split: str) -> list[str]:
    return [t for i, t in enumerate(items) if (i % HELD_OUT == 0) == (split == "eval")]


def prompt(rng: random.Random, split: str) -> str:
    kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    items, forms = FORMS[kind]
    return rng.choice(forms).format(s=rng.choice(_pool(items, split)), n=rng.choice(["three", "five", "a few"]),
                                    lang=rng.choice(LANGUAGES))
